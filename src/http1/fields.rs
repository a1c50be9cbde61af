//! An upstream's answer fields passed through as the upstream wrote them:
//! the head's bytes and where each field lies in them, carried by the
//! answer's body ([`Passed`], read through
//! [`TextFields`](super::text_fields::TextFields)) instead of a `HeaderMap`
//! built field by field, when the answer goes back on a native connection.
//!
//! The native client makes them: it parses the head in place, acts on the
//! framing fields itself, leaves out the hop-by-hop fields (RFC 9110
//! §7.6.1: `Connection`, the fields it names, `Keep-Alive`, `TE`,
//! `Transfer-Encoding`, `Upgrade`, `Proxy-Connection`), and puts only a
//! `Content-Length` into the map. The native server's writer copies the
//! rest, name and value as received, one copy a field ([`Passed::write`]).
//!
//! Everything else sees the map it would have seen had every field been
//! read into it: code that reads the answer's fields, or changes them but
//! by inserting fields of its own, first calls
//! [`materialize`](super::text_fields::materialize), which
//! reads the passed fields into the map and takes them out of the body.
//! Until then the map holds only fields the gateway inserted
//! (and the length), and a field inserted there replaces the passed ones
//! of its name, as an insert into the whole map would: the writer leaves
//! those out.
//!
//! Names and values are held to what `http`'s `HeaderName` and
//! `HeaderValue` take without building them: `httparse` reads a name as
//! RFC 9110's `token` and a value as visible ASCII, obs-text, spaces and
//! tabs, the same sets those types check (a test holds the two to each
//! other byte by byte); what is left is the name's length, checked as the
//! client reads the head.

use bytes::Bytes;
use http::header::{
    ACCEPT_RANGES, CACHE_CONTROL, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, DATE,
    ETAG, EXPIRES, LAST_MODIFIED, LOCATION, SERVER, SET_COOKIE, TRANSFER_ENCODING, VARY,
};
use http::{HeaderMap, HeaderName, HeaderValue};

/// The longest field name `HeaderName` takes.
pub const MAX_NAME: usize = (1 << 16) - 1;

/// Where one field lies in the head's bytes: `name..name_end`, then
/// `value..value_end`.
#[derive(Debug, Clone, Copy)]
struct Field {
    name: u32,
    name_end: u32,
    value: u32,
    value_end: u32,
}

/// An answer's fields as its upstream wrote them, minus the hop-by-hop
/// ones and `Content-Length`: the head's bytes and each field's place in
/// them (see the module docs).
#[derive(Debug, Clone)]
pub struct Passed {
    head: Bytes,
    fields: smallvec::SmallVec<[Field; 16]>,
    /// A `Date` field is among them.
    date: bool,
}

impl Passed {
    /// No fields yet, of the head `head`.
    pub fn new(head: Bytes) -> Self {
        Self {
            head,
            fields: smallvec::SmallVec::new(),
            date: false,
        }
    }

    /// Adds the field whose name and value lie at these places in the
    /// head, name checked by the caller (a `token` of at most [`MAX_NAME`]
    /// bytes) and value too (what `HeaderValue` takes). The head is under
    /// 4 GiB (the client's under 1 MiB), so each place fits a `u32`.
    pub fn push(&mut self, name: (usize, usize), value: (usize, usize)) {
        let at = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        self.date |= self.head[name.0..name.1].eq_ignore_ascii_case(b"date");
        self.fields.push(Field {
            name: at(name.0),
            name_end: at(name.1),
            value: at(value.0),
            value_end: at(value.1),
        });
    }

    /// Keeps only the fields whose names `keep` picks.
    pub fn retain_names(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        let head = &self.head;
        self.fields.retain(|f| keep(name_of(head, f)));
        self.date = self
            .fields
            .iter()
            .any(|f| name_of(head, f).eq_ignore_ascii_case(b"date"));
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Writes the fields into `dst` as `name: value` lines, but those
    /// whose names `map` holds (the gateway's inserts replace them);
    /// `true` when a `Date` field was among those written.
    pub fn write(&self, dst: &mut Vec<u8>, map: &HeaderMap) -> bool {
        dst.reserve(self.head.len());
        let head = &self.head[..];
        let mut date = self.date;
        for f in &self.fields {
            let name = name_of(head, f);
            if !map.is_empty()
                && map
                    .keys()
                    .any(|k| k.as_str().as_bytes().eq_ignore_ascii_case(name))
            {
                date &= !name.eq_ignore_ascii_case(b"date");
                continue;
            }
            let (name, name_end, value, value_end) = (
                f.name as usize,
                f.name_end as usize,
                f.value as usize,
                f.value_end as usize,
            );
            // Most lines are `name: value` already: one copy.
            if head.get(name_end..value) == Some(b": ") {
                dst.extend_from_slice(&head[name..value_end]);
            } else {
                dst.extend_from_slice(&head[name..name_end]);
                dst.extend_from_slice(b": ");
                dst.extend_from_slice(&head[value..value_end]);
            }
            dst.extend_from_slice(b"\r\n");
        }
        date
    }
}

fn name_of<'a>(head: &'a [u8], f: &Field) -> &'a [u8] {
    &head[f.name as usize..f.name_end as usize]
}

/// Reads `passed` into `headers`: the map is then the one every field
/// read into it would have made — the passed fields in order, then each
/// of the map's own as an insert (its first value) and appends (the
/// rest).
pub fn read_into(headers: &mut HeaderMap, passed: &Passed) {
    let own = std::mem::take(headers);
    let mut map = HeaderMap::with_capacity(passed.fields.len() + own.len());
    for f in &passed.fields {
        // Both hold: the client checked the name and value it pushed.
        let Some(name) = field_name(name_of(&passed.head, f)) else {
            continue;
        };
        let value = passed.head.slice(f.value as usize..f.value_end as usize);
        let Ok(value) = HeaderValue::from_maybe_shared(value) else {
            continue;
        };
        map.append(name, value);
    }
    let mut last: Option<HeaderName> = None;
    for (name, value) in own {
        match name {
            Some(name) => {
                map.insert(name.clone(), value);
                last = Some(name);
            }
            None => {
                if let Some(name) = &last {
                    map.append(name.clone(), value);
                }
            }
        }
    }
    *headers = map;
}

/// A field's name: one of the fields answers commonly carry, recognised
/// as is, or else what `HeaderName::from_bytes` makes of it (lower-cased
/// into a scratch buffer and looked up, or copied); `None` when it is not
/// a name.
pub fn field_name(name: &[u8]) -> Option<HeaderName> {
    let first = name.first().map_or(0, |b| b | 0x20);
    let common = match (name.len(), first) {
        (4, b'd') => DATE,
        (4, b'e') => ETAG,
        (4, b'v') => VARY,
        (6, b's') => SERVER,
        (7, b'e') => EXPIRES,
        (8, b'l') => LOCATION,
        (10, b'c') => CONNECTION,
        (10, b's') => SET_COOKIE,
        (12, b'c') => CONTENT_TYPE,
        (13, b'a') => ACCEPT_RANGES,
        (13, b'c') => CACHE_CONTROL,
        (13, b'l') => LAST_MODIFIED,
        (14, b'c') => CONTENT_LENGTH,
        (16, b'c') => CONTENT_ENCODING,
        (17, b't') => TRANSFER_ENCODING,
        _ => return HeaderName::from_bytes(name).ok(),
    };
    if is_token_of(name, common.as_str().as_bytes()) {
        Some(common)
    } else {
        HeaderName::from_bytes(name).ok()
    }
}

/// Whether `token`, a field name `httparse` read, is `lower` (lower-case
/// letters and `-`, as long) but for ASCII case, compared eight bytes at a
/// time. Under `| 0x20` a token character becomes a lower-case letter only
/// when it is that letter in either case, and `-` only when it is `-`; so
/// `t | 0x20 == l` is that `t` is `l` but for case.
pub fn is_token_of(token: &[u8], lower: &[u8]) -> bool {
    const CASE: u64 = u64::from_ne_bytes([0x20; 8]);
    let word = |s: &[u8], at: usize| {
        s.get(at..)
            .and_then(<[u8]>::first_chunk::<8>)
            .map(|w| u64::from_ne_bytes(*w))
    };
    let len = lower.len();
    if token.len() != len {
        return false;
    }
    if len < 8 {
        return token.iter().zip(lower).all(|(&t, &l)| t | 0x20 == l);
    }
    // Whole words from the start, the last one ending at the end (and
    // overlapping the one before it).
    let mut at = 0;
    loop {
        let at_word = at.min(len - 8);
        match (word(token, at_word), word(lower, at_word)) {
            (Some(t), Some(l)) if t | CASE == l => {}
            _ => return false,
        }
        if at_word + 8 >= len {
            return true;
        }
        at += 8;
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::{HeaderMap, HeaderName, HeaderValue, Response};

    use super::{Passed, read_into};

    /// Whether `httparse` takes the response head with this one field.
    fn parses(field: &[u8]) -> bool {
        let mut text = b"HTTP/1.1 200 OK\r\n".to_vec();
        text.extend_from_slice(field);
        text.extend_from_slice(b"\r\n\r\n");
        let mut fields = [httparse::EMPTY_HEADER; 4];
        matches!(
            httparse::Response::new(&mut fields).parse(&text),
            Ok(httparse::Status::Complete(_))
        )
    }

    #[test]
    fn httparse_takes_the_names_and_values_http_takes_byte_for_byte() {
        for b in 0..=255u8 {
            let value = [b'a', b, b'a'];
            let mut field = b"x: ".to_vec();
            field.extend_from_slice(&value);
            assert_eq!(
                parses(&field),
                HeaderValue::from_bytes(&value).is_ok(),
                "value byte {b:#04x}"
            );
            if b == b':' {
                // Where a name ends.
                continue;
            }
            let name = [b'a', b, b'a'];
            let mut field = name.to_vec();
            field.extend_from_slice(b": v");
            assert_eq!(
                parses(&field),
                HeaderName::from_bytes(&name).is_ok(),
                "name byte {b:#04x}"
            );
        }
    }

    /// Where a field's name and value lie.
    type Spans = ((usize, usize), (usize, usize));

    fn passed(head: &'static [u8], spans: &[Spans]) -> Passed {
        let mut p = Passed::new(Bytes::from_static(head));
        for &(name, value) in spans {
            p.push(name, value);
        }
        p
    }

    #[test]
    fn a_field_the_map_holds_replaces_the_passed_ones_of_its_name() {
        let head: &[u8] = b"X-Id: up\r\nDate: d\r\nx-id:other\r\n";
        let p = passed(
            head,
            &[((0, 4), (6, 8)), ((10, 14), (16, 17)), ((19, 23), (24, 29))],
        );
        let mut out = Vec::new();
        assert!(p.write(&mut out, &HeaderMap::new()));
        assert_eq!(out, b"X-Id: up\r\nDate: d\r\nx-id: other\r\n");
        let mut map = HeaderMap::new();
        map.insert("x-id", HeaderValue::from_static("gw"));
        map.insert("date", HeaderValue::from_static("now"));
        out.clear();
        assert!(!p.write(&mut out, &map));
        assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
        // Read into the map, the gateway's value is the one there.
        let mut res = Response::new(());
        res.headers_mut()
            .insert("x-id", HeaderValue::from_static("gw"));
        res.headers_mut()
            .append("x-id", HeaderValue::from_static("gw2"));
        read_into(res.headers_mut(), &p);
        let ids: Vec<_> = res.headers().get_all("x-id").iter().collect();
        assert_eq!(ids, ["gw", "gw2"]);
        assert_eq!(res.headers()["date"], "d");
        let names: Vec<_> = res.headers().keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["x-id", "date"]);
    }
}
