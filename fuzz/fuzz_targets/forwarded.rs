//! `X-Forwarded-For` / `Forwarded` walking on arbitrary header bytes.
//!
//! The input is split into header lines at `\n`; a first byte chooses
//! whether they are `X-Forwarded-For` or `Forwarded` lines. Beyond "never
//! panics", the walk must return the peer or an address that some entry
//! actually spelled — never an address made up from garbage.
#![no_main]

use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use tollgate::identity::forwarded;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let name = if mode & 1 == 0 { "x-forwarded-for" } else { "forwarded" };
    let mut headers = HeaderMap::new();
    let mut seen: Vec<IpAddr> = Vec::new();
    for line in rest.split(|&b| b == b'\n') {
        let Ok(value) = HeaderValue::from_bytes(line) else {
            continue;
        };
        if mode & 1 == 0 {
            for entry in line.split(|&b| b == b',') {
                seen.extend(forwarded::parse_xff_entry(entry));
            }
        } else {
            let mut out = Vec::new();
            forwarded::forwarded_for(line, &mut out);
            seen.extend(out.into_iter().flatten());
        }
        headers.append(name, value);
    }
    let peer: IpAddr = "10.0.0.1".parse().expect("literal address");
    let trusted: Vec<IpNet> = vec![
        "10.0.0.0/8".parse().expect("literal network"),
        "::1/128".parse().expect("literal network"),
    ];
    let client = forwarded::client_ip(&headers, peer, &trusted);
    let canon = |ip: IpAddr| tollgate::identity::canonical(ip);
    assert!(
        client == peer || seen.iter().any(|&s| canon(s) == client),
        "{client} was never written in the headers"
    );
});
