//! `simulate`'s HTML reports, from the folder `admin.replays` names, opened
//! from the console. Nothing is uploaded and nothing is replayed here: the
//! gateway only serves files `tollgate simulate --html` wrote.
//!
//! A report is opened in a tab of its own, where no bearer header can go,
//! so its link carries a ticket instead: HMAC-SHA256, keyed by the admin
//! token, of the file's name and the ticket's expiry ([`TICKET_LIFE`]). A
//! report is served under [`CSP`], a sandbox without scripts or
//! same-origin rights: it runs no code, and is a page of an opaque origin
//! that cannot read the console's storage (its token) nor call the admin
//! API as the console. Its own inline styles are allowed there only.

use std::path::Path;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use serde_json::json;
use sha2::Sha256;

use crate::pipeline::Gateway;

/// How long a report's link stays good.
pub const TICKET_LIFE_MS: u64 = 10 * 60 * 1000;
/// The largest report served.
pub const MAX_BYTES: u64 = 32 * 1024 * 1024;
/// Where reports are served.
pub const PREFIX: &str = "/console/replays/";

/// A report's policy: a sandbox (an opaque origin, no scripts, no forms,
/// no popups), nothing loaded from anywhere, its inline styles and data
/// images only.
pub const CSP: &str = "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Whether `name` may be a report's file name: `[A-Za-z0-9._-]`, ending
/// `.html`, not hidden.
fn valid(name: &str) -> bool {
    name.ends_with(".html")
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn ticket(token: &str, name: &str, expires: u64) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(token.as_bytes()) else {
        return String::new();
    };
    mac.update(format!("tollgate replay\0{name}\0{expires}").as_bytes());
    let sum = mac.finalize().into_bytes();
    let hex: String = sum.iter().map(|b| format!("{b:02x}")).collect();
    format!("{expires}.{hex}")
}

fn ticket_ok(token: &str, name: &str, given: &str, now: u64) -> bool {
    let Some((expires, _)) = given.split_once('.') else {
        return false;
    };
    let Ok(expires) = expires.parse::<u64>() else {
        return false;
    };
    if expires < now {
        return false;
    }
    let want = ticket(token, name, expires);
    subtle::ConstantTimeEq::ct_eq(want.as_bytes(), given.as_bytes()).into()
}

/// `GET /admin/console/replays` (behind the token): the reports, each with
/// a link good for [`TICKET_LIFE_MS`].
pub fn list(gw: &Gateway, now: u64) -> serde_json::Value {
    let (dir, token) = gw.with_config(|c| (c.admin_replays.clone(), c.admin_token.clone()));
    let (Some(dir), Some(token)) = (dir, token) else {
        return json!({ "configured": false, "reports": [] });
    };
    let mut reports: Vec<(String, u64)> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let meta = e.metadata().ok()?;
                (valid(&name) && meta.is_file()).then_some((name, meta.len()))
            })
            .collect(),
        Err(e) => {
            return json!({ "configured": true, "reports": [], "error": format!("{}: {e}", dir.display()) });
        }
    };
    reports.sort();
    let expires = now + TICKET_LIFE_MS;
    let reports: Vec<serde_json::Value> = reports
        .into_iter()
        .map(|(name, bytes)| {
            let url = format!("{PREFIX}{name}?ticket={}", ticket(&token, &name, expires));
            json!({ "name": name, "bytes": bytes, "url": url })
        })
        .collect();
    json!({ "configured": true, "reports": reports })
}

/// `GET /console/replays/NAME?ticket=…`: the report under [`CSP`], or 404
/// for a name, ticket or file that does not hold up (the same answer for
/// each, so a link proves nothing about the folder).
pub fn open(gw: &Gateway, path: &str, query: &str, now: u64) -> Response<Full<Bytes>> {
    let name = path.strip_prefix(PREFIX).unwrap_or("");
    let given = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("ticket="))
        .unwrap_or("");
    let (dir, token) = gw.with_config(|c| (c.admin_replays.clone(), c.admin_token.clone()));
    let body = match (dir, token) {
        (Some(dir), Some(token)) if valid(name) && ticket_ok(&token, name, given, now) => {
            read(&dir.join(name))
        }
        _ => None,
    };
    let (status, body, kind) = match body {
        Some(b) => (StatusCode::OK, b, "text/html; charset=utf-8"),
        None => (
            StatusCode::NOT_FOUND,
            Bytes::from_static(
                b"no such report, or its link has expired; open it from the console again\n",
            ),
            "text/plain; charset=utf-8",
        ),
    };
    let mut res = Response::new(Full::new(body));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    super::policy::guard(&mut res, CSP);
    res
}

fn read(path: &Path) -> Option<Bytes> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_BYTES {
        return None;
    }
    std::fs::read(path).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_bind_the_name_the_token_and_the_time() {
        let t = ticket("secret", "a.html", 1_000);
        assert!(ticket_ok("secret", "a.html", &t, 999));
        assert!(!ticket_ok("secret", "a.html", &t, 1_001));
        assert!(!ticket_ok("secret", "b.html", &t, 999));
        assert!(!ticket_ok("other", "a.html", &t, 999));
        let later = t.replacen("1000.", "2000.", 1);
        assert!(!ticket_ok("secret", "a.html", &later, 999));
    }

    #[test]
    fn only_plain_html_names_are_reports() {
        assert!(valid("run-1.html"));
        for bad in [
            "../x.html",
            ".x.html",
            "x.htm",
            "a/b.html",
            "x.html\0",
            "%2e.html",
        ] {
            assert!(!valid(bad), "{bad}");
        }
    }
}
