//! The admin port without a token: what a web page on the LAN could make a browser send is refused
//! (another Host by DNS rebinding, a foreign Origin, a form POST); with a token, the token is
//! checked before any body is read.

use super::{check_closed, send_raw};
use crate::support::{host, request, Harness};

#[test]
fn without_a_token_only_requests_no_web_page_can_forge_are_served_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let admin = h.server().admin_addr();
    let own = format!("Host: {admin}");
    let port = admin.port();
    for (head, status) in [
        (format!("GET /admin/leases HTTP/1.1\r\n{own}\r\n\r\n"), 200),
        (format!("GET /admin/leases HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n"), 200),
        ("GET /admin/leases HTTP/1.1\r\nHost: evil.example:80\r\n\r\n".to_string(), 403),
        (format!("GET /admin/leases HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n"), 403),
        // No Host: HTTP/1.1 needs one (400, issue 24); HTTP/1.0 names no listener (403).
        ("GET /admin/leases HTTP/1.1\r\n\r\n".to_string(), 400),
        ("GET /admin/leases HTTP/1.0\r\n\r\n".to_string(), 403),
        (
            format!("GET /admin/leases HTTP/1.1\r\n{own}\r\nOrigin: http://evil.example\r\n\r\n"),
            403,
        ),
        (
            format!(
                "POST /admin/release HTTP/1.1\r\n{own}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
                 Content-Length: 17\r\n\r\n{{\"route\":\"projA\"}}"
            ),
            415,
        ),
        (
            format!(
                "POST /admin/release HTTP/1.1\r\n{own}\r\nContent-Type: application/json\r\n\
                 Origin: http://{admin}\r\nContent-Length: 17\r\n\r\n{{\"route\":\"projA\"}}"
            ),
            200,
        ),
    ] {
        let (_, answer) = send_raw(admin, head.as_bytes());
        assert_eq!(answer.status, status, "{head:?}: {}", answer.text());
    }
}

#[test]
fn with_a_token_a_wrong_one_is_refused_before_the_body_is_read_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "admin_token = \"sekrit\"");
    let admin = h.server().admin_addr();
    // The body is declared huge and never sent: the answer cannot wait for it.
    let head = "POST /admin/drain HTTP/1.1\r\nHost: anything\r\nAuthorization: Bearer nope\r\n\
                Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{";
    let (mut conn, answer) = send_raw(admin, head.as_bytes());
    assert_eq!(answer.status, 401, "{}", answer.text());
    check_closed(&mut conn);
    // Issue 24: two Authorization headers are refused, whichever of them is right.
    for pair in [
        "Bearer sekrit\r\nAuthorization: Bearer nope",
        "Bearer nope\r\nAuthorization: Bearer sekrit",
    ] {
        let head =
            format!("GET /admin/status HTTP/1.1\r\nHost: x\r\nAuthorization: {pair}\r\n\r\n");
        let (_, answer) = send_raw(admin, head.as_bytes());
        assert_eq!(answer.status, 400, "{}", answer.text());
    }
    let ok = request(
        admin,
        "GET",
        "/admin/status",
        &[("Authorization", "Bearer sekrit")],
        b"",
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
}
