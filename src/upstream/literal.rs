//! The forwarding agents' resolver (issue 26): a host's URL names it by address in most homelabs
//! (`http://192.168.1.20:8080`), and ureq's own resolver formats `host:port` into a new string
//! and parses it back on every request — 1.5 % of crossbar's instructions per request. An
//! address in the URL is read in place here; a name goes to ureq's resolver as before, looked up
//! on every request (a box's address may change under its name).

use std::net::{IpAddr, SocketAddr};

use ureq::config::Config;
use ureq::http::uri::Scheme;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;
use ureq::Error;

/// Addresses in a URL read in place; names resolved by ureq's [`DefaultResolver`]. ureq's
/// `ip_family` filter is not applied to an address read in place: crossbar never sets it, and a
/// URL that names an address has chosen its family.
#[derive(Debug, Default)]
pub struct Literal {
    names: DefaultResolver,
}

impl Resolver for Literal {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, Error> {
        match address(uri) {
            Some(addr) => {
                let mut one = self.empty();
                one.push(addr);
                Ok(one)
            }
            None => self.names.resolve(uri, config, timeout),
        }
    }
}

/// The socket address of a plain `http` URL whose host is an IP address (IPv6 in brackets), with
/// its port or 80. Anything else — a name, another scheme, no authority — is `None`, for ureq's
/// resolver to handle or refuse as it always has.
fn address(uri: &Uri) -> Option<SocketAddr> {
    if uri.scheme() != Some(&Scheme::HTTP) {
        return None;
    }
    let authority = uri.authority()?;
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ip: IpAddr = host.parse().ok()?;
    Some(SocketAddr::new(ip, authority.port_u16().unwrap_or(80)))
}

#[cfg(test)]
mod tests {
    use super::address;

    fn of(url: &str) -> Option<String> {
        address(&url.parse().unwrap()).map(|a| a.to_string())
    }

    #[test]
    fn an_address_in_the_url_is_read_in_place_and_a_name_is_left_to_the_resolver() {
        assert_eq!(
            of("http://127.0.0.1:8080/v1/chat").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(of("http://10.0.0.7/health").as_deref(), Some("10.0.0.7:80"));
        assert_eq!(of("http://[::1]:9000/x").as_deref(), Some("[::1]:9000"));
        assert_eq!(of("http://gpu-box.lan:8080/x"), None);
        assert_eq!(of("http://localhost:8080/x"), None);
        // Not this resolver's to answer: ureq refuses or resolves these as before.
        assert_eq!(of("https://127.0.0.1:8443/x"), None);
        assert_eq!(of("/no/authority"), None);
    }
}
