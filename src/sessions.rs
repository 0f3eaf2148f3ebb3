//! Signing in to the status page when `admin_token` is set (issue 27). A browser cannot send a
//! bearer token, so the page offers a form that POSTs the token once; the answer sets a cookie
//! holding a random session id — never the token — and the browser sends it from then on.
//!
//! [`Sessions`] is the table of live ids: at most [`MAX_SESSIONS`], each for [`LIFETIME`] from its
//! sign-in, all forgotten when `admin_token` changes (`Gateway::apply_config`). Ids are 256 bits
//! from the OS and compared in constant time. Cookies are not port-scoped, so the client listener
//! drops this one from what it forwards ([`strip_cookie`]). This module does no I/O but reading
//! `/dev/urandom` for a new id.

use std::borrow::Cow;
use std::io::Read;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use subtle::{Choice, ConstantTimeEq};

use crate::conn::Headers;

/// The cookie's name. The client listener strips exactly this name from what it forwards.
pub const COOKIE: &str = "crossbar_session";
/// Most sessions at once; signing in past it ends the oldest.
pub const MAX_SESSIONS: usize = 64;
/// How long a session lives after its sign-in, used or not.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Random bytes in an id.
const ID_BYTES: usize = 32;

/// The live sign-in sessions.
#[derive(Debug, Default)]
pub struct Sessions(Mutex<Inner>);

/// Invariant: at most [`MAX_SESSIONS`] entries, oldest first; expired ones may linger until the
/// next sign-in drops them, and never pass [`Sessions::check`].
#[derive(Debug, Default)]
struct Inner {
    live: Vec<Session>,
}

#[derive(Debug)]
struct Session {
    id: [u8; ID_BYTES],
    expires: Instant,
}

impl Sessions {
    /// Opens a session and returns its id as the cookie carries it (hex). The table full, the
    /// oldest session ends.
    pub fn open(&self, now: Instant) -> std::io::Result<String> {
        let mut id = [0u8; ID_BYTES];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut id)?;
        let mut inner = self.0.lock();
        inner.live.retain(|s| s.expires > now);
        if inner.live.len() >= MAX_SESSIONS {
            inner.live.remove(0);
        }
        inner.live.push(Session {
            id,
            expires: now + LIFETIME,
        });
        Ok(hex(&id))
    }

    /// Whether `id` (a cookie's value) names a live session. Every entry is compared, each in
    /// constant time, so how long it takes says nothing about which id is near.
    pub fn check(&self, id: &str, now: Instant) -> bool {
        let Some(id) = unhex(id) else {
            return false;
        };
        let inner = self.0.lock();
        let mut found = Choice::from(0);
        for session in &inner.live {
            found |= session.id.ct_eq(&id) & Choice::from(u8::from(session.expires > now));
        }
        found.into()
    }

    /// Ends the session `id`, if it is one (signing out).
    pub fn close(&self, id: &str) {
        if let Some(id) = unhex(id) {
            self.0.lock().live.retain(|s| !bool::from(s.id.ct_eq(&id)));
        }
    }

    /// Ends every session: the token they were opened with is no longer the token.
    pub fn clear(&self) {
        self.0.lock().live.clear();
    }

    /// Sessions in the table (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.0.lock().live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The values of crossbar's cookie in a request's `Cookie` headers.
pub fn cookies(headers: &Headers) -> impl Iterator<Item = &str> {
    (headers.all("Cookie"))
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
}

/// A `Cookie` header's value without crossbar's own cookie, for a request forwarded upstream:
/// `None` when nothing else is left, the value untouched when it was not there.
pub fn strip_cookie(value: &str) -> Option<Cow<'_, str>> {
    let ours = |pair: &str| {
        pair.trim()
            .split_once('=')
            .is_some_and(|(n, _)| n == COOKIE)
    };
    if !value.split(';').any(ours) {
        return Some(Cow::Borrowed(value));
    }
    let rest: Vec<&str> = (value.split(';'))
        .filter(|pair| !ours(pair) && !pair.trim().is_empty())
        .map(str::trim)
        .collect();
    (!rest.is_empty()).then(|| Cow::Owned(rest.join("; ")))
}

/// The `Set-Cookie` value for a new session: HttpOnly (no script reads it) and SameSite=Strict
/// (no other site's page makes the browser send it). Not `Secure`: the admin listener is plain
/// HTTP, on loopback or a LAN.
pub fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        LIFETIME.as_secs()
    )
}

/// The `Set-Cookie` value that makes the browser forget the session.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// The `token` field of a sign-in form's `application/x-www-form-urlencoded` body, decoded.
pub fn form_token(body: &[u8]) -> Option<Vec<u8>> {
    (body.split(|b| *b == b'&'))
        .find_map(|pair| pair.strip_prefix(b"token="))
        .and_then(form_decode)
}

/// Decodes a form value: `+` is a space, `%XX` a byte; `None` for a malformed escape.
fn form_decode(value: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(value.len());
    let mut bytes = value.iter();
    while let Some(&b) = bytes.next() {
        out.push(match b {
            b'+' => b' ',
            b'%' => {
                let hi = (*bytes.next()? as char).to_digit(16)?;
                let lo = (*bytes.next()? as char).to_digit(16)?;
                u8::try_from(hi * 16 + lo).ok()?
            }
            b => b,
        });
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An id as [`hex`] writes it, or `None` for anything else.
fn unhex(text: &str) -> Option<[u8; ID_BYTES]> {
    if text.len() != ID_BYTES * 2 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut id = [0u8; ID_BYTES];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        id[i] = digit(pair[0])? * 16 + digit(pair[1])?;
    }
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_lives_its_lifetime_and_the_table_keeps_the_newest() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let first = sessions.open(start).unwrap();
        assert_eq!(first.len(), 64);
        assert!(sessions.check(&first, start + LIFETIME - Duration::from_secs(1)));
        assert!(!sessions.check(&first, start + LIFETIME));
        let mut other = first.clone().into_bytes();
        other[63] = if other[63] == b'0' { b'1' } else { b'0' };
        assert!(!sessions.check(&String::from_utf8(other).unwrap(), start));
        let upper = format!("{}F", &first[..63].to_uppercase());
        assert!(
            !sessions.check(&upper, start),
            "only lower-case hex, as written"
        );
        assert!(!sessions.check("", start));
        let later: Vec<String> = (0..MAX_SESSIONS)
            .map(|_| sessions.open(start).unwrap())
            .collect();
        assert_eq!(sessions.len(), MAX_SESSIONS);
        assert!(!sessions.check(&first, start), "the oldest went");
        assert!(later.iter().all(|id| sessions.check(id, start)));
        assert_ne!(later[0], later[1]);
        sessions.close(&later[0]);
        assert!(!sessions.check(&later[0], start));
        sessions.clear();
        assert!(sessions.is_empty());
    }

    #[test]
    fn only_crossbars_cookie_is_stripped() {
        let id = "crossbar_session=abc";
        for (value, want) in [
            ("a=1; crossbar_session=abc; b=2", Some("a=1; b=2")),
            (id, None),
            ("crossbar_session=abc;a=1", Some("a=1")),
            ("a=1; b=2", Some("a=1; b=2")),
            (
                "crossbar_session_x=1; xcrossbar_session=2",
                Some("crossbar_session_x=1; xcrossbar_session=2"),
            ),
        ] {
            assert_eq!(strip_cookie(value).as_deref(), want, "{value}");
        }
        let headers: Headers = [("cookie", "a=1; crossbar_session=x1")]
            .into_iter()
            .collect();
        assert_eq!(cookies(&headers).collect::<Vec<_>>(), ["x1"]);
    }

    #[test]
    fn a_forms_token_is_decoded() {
        assert_eq!(form_token(b"token=a%2Bb+c").as_deref(), Some(&b"a+b c"[..]));
        assert_eq!(form_token(b"x=1&token=t").as_deref(), Some(&b"t"[..]));
        assert_eq!(form_token(b"token=%zz"), None);
        assert_eq!(form_token(b"tok=t"), None);
    }
}
