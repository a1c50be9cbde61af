//! Calendar arithmetic for log timestamps, in UTC, without a date crate:
//! the three forms the inputs use (the access-log `[10/Oct/2000:13:55:36
//! -0700]`, RFC 3339, epoch numbers) and the minute labels of the report.

use crate::clock::{civil_from_days, days_from_civil};

fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0, |n, &c| n * 10 + u32::from(c - b'0')))
}

fn month(b: &[u8]) -> Option<u32> {
    const NAMES: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    NAMES.iter().position(|n| n[..] == *b).map(|i| i as u32 + 1)
}

fn ms_of(days: i64, h: u32, mi: u32, s: u32, ms: u32, offset_s: i64) -> Option<u64> {
    if h > 23 || mi > 59 || s > 60 || ms > 999 {
        return None;
    }
    let secs = days * 86_400 + i64::from(h * 3600 + mi * 60 + s) - offset_s;
    u64::try_from(secs * 1000 + i64::from(ms)).ok()
}

/// `10/Oct/2000:13:55:36 -0700` (the access-log `$time_local`), with
/// optional milliseconds (`13:55:36.123`): milliseconds since the epoch.
pub fn parse_clf(b: &[u8]) -> Option<u64> {
    if b.len() < 26 || b[2] != b'/' || b[6] != b'/' || b[11] != b':' {
        return None;
    }
    let d = digits(&b[0..2])?;
    let m = month(&b[3..6])?;
    let y = digits(&b[7..11])?;
    let h = digits(&b[12..14])?;
    let mi = digits(&b[15..17])?;
    let s = digits(&b[18..20])?;
    let (ms, rest) = match b.get(20) {
        Some(b'.') => {
            let end = b[21..].iter().position(|c| !c.is_ascii_digit())? + 21;
            (fraction_ms(&b[21..end])?, &b[end..])
        }
        _ => (0, &b[20..]),
    };
    let offset = match rest {
        [b' ', sign @ (b'+' | b'-'), z @ ..] if z.len() == 4 => {
            let o = i64::from(digits(&z[..2])? * 3600 + digits(&z[2..])? * 60);
            if *sign == b'-' { -o } else { o }
        }
        _ => return None,
    };
    if !(1..=31).contains(&d) {
        return None;
    }
    ms_of(days_from_civil(i64::from(y), m, d), h, mi, s, ms, offset)
}

fn fraction_ms(b: &[u8]) -> Option<u32> {
    if b.is_empty() {
        return None;
    }
    let mut ms = 0;
    for i in 0..3 {
        ms = ms * 10 + b.get(i).map_or(0, |c| u32::from(c - b'0'));
    }
    Some(ms)
}

/// RFC 3339 (`2024-05-01T12:00:00.123Z`, `…+02:00`): ms since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let y = digits(&b[0..4])?;
    let m = digits(&b[5..7])?;
    let d = digits(&b[8..10])?;
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let h = digits(&b[11..13])?;
    let mi = digits(&b[14..16])?;
    let sec = digits(&b[17..19])?;
    let mut rest = &b[19..];
    let mut ms = 0;
    if rest.first() == Some(&b'.') {
        let end = rest[1..]
            .iter()
            .position(|c| !c.is_ascii_digit())
            .map_or(rest.len(), |i| i + 1);
        ms = fraction_ms(&rest[1..end])?;
        rest = &rest[end..];
    }
    let offset = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), hh @ .., b':', m1, m2] if hh.len() == 2 => {
            let o = i64::from(digits(hh)? * 3600 + digits(&[*m1, *m2])? * 60);
            if *sign == b'-' { -o } else { o }
        }
        _ => return None,
    };
    ms_of(days_from_civil(i64::from(y), m, d), h, mi, sec, ms, offset)
}

/// `2024-05-01T12:03Z`: the minute starting at `ms`, in UTC.
pub fn minute_label(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let (y, m, d) = civil_from_days(days);
    let in_day = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}Z",
        in_day / 3600,
        in_day % 3600 / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_log_time() {
        // 2000-10-10 20:55:36 UTC
        assert_eq!(
            parse_clf(b"10/Oct/2000:13:55:36 -0700"),
            Some(971_211_336_000)
        );
        assert_eq!(
            parse_clf(b"10/Oct/2000:20:55:36.250 +0000"),
            Some(971_211_336_250)
        );
        assert_eq!(parse_clf(b"10/Oct/2000:13:55:36"), None);
        assert_eq!(parse_clf(b"10/Okt/2000:13:55:36 -0700"), None);
    }

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339("2000-10-10T20:55:36Z"), Some(971_211_336_000));
        assert_eq!(
            parse_rfc3339("2000-10-10T22:55:36.5+02:00"),
            Some(971_211_336_500)
        );
        assert_eq!(parse_rfc3339("2000-10-10"), None);
    }

    #[test]
    fn round_trip_days() {
        for days in [-1000, 0, 11_000, 19_000, 20_000, 60_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(minute_label(971_211_336_000), "2000-10-10T20:55Z");
    }
}
