//! The report as one self-contained HTML page: the summary, and per route
//! a chart of allowed against limited requests over time (inline SVG,
//! stacked bars, one per minute or per a few minutes for long logs), its
//! limits and its top offenders. No script, no font, nothing fetched.

use std::fmt::Write as _;

use super::report::{MinuteOut, Offender, Report, Route};
use super::table::{percent, thousands};
use super::time::minute_label;

/// Bars per chart at most; longer logs put several minutes in one bar.
const MAX_BARS: u64 = 480;
const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 240.0;
const LEFT: f64 = 64.0;
const BOTTOM: f64 = 28.0;
const TOP: f64 = 12.0;

const ALLOWED: &str = "#3b82c4";
const LIMITED: &str = "#d9452b";
const SHADOW: &str = "#e0a526";

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Per bar: (start ms, allowed, limited, shadow-limited).
fn bars(t: &[MinuteOut], first: u64, last: u64) -> (u64, Vec<(u64, u64, u64, u64)>) {
    let minutes = (last - first) / 60_000 + 1;
    let per_bar = minutes.div_ceil(MAX_BARS).max(1);
    let n = minutes.div_ceil(per_bar) as usize;
    let mut out: Vec<(u64, u64, u64, u64)> = (0..n)
        .map(|i| (first + i as u64 * per_bar * 60_000, 0, 0, 0))
        .collect();
    for m in t {
        let i = ((m.ts_ms.saturating_sub(first)) / 60_000 / per_bar) as usize;
        if let Some(b) = out.get_mut(i) {
            let shadow = m.shadow_limited.unwrap_or(0);
            b.1 += m.requests - m.limited - shadow;
            b.2 += m.limited;
            b.3 += shadow;
        }
    }
    (per_bar, out)
}

fn chart(out: &mut String, route: &Route, first: u64, last: u64) {
    let (per_bar, bars) = bars(&route.timeline, first, last);
    let max = bars
        .iter()
        .map(|b| b.1 + b.2 + b.3)
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = WIDTH - LEFT - 8.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let bw = plot_w / bars.len() as f64;
    let y = |v: u64| TOP + plot_h - (v as f64 / max as f64) * plot_h;
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="requests of route {name} per {per_bar} minute(s): allowed and limited">"#,
        name = esc(&route.name)
    );
    // Grid and axis labels: 0, half, max.
    for v in [0, max / 2, max] {
        let yy = y(v);
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{x2:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx:.1}" y="{ty:.1}" font-size="11" text-anchor="end" fill="#555">{label}</text>"##,
            x2 = WIDTH - 8.0,
            tx = LEFT - 6.0,
            ty = yy + 4.0,
            label = thousands(v)
        );
    }
    for (i, b) in bars.iter().enumerate() {
        let x = LEFT + i as f64 * bw;
        let w = (bw - if bw > 3.0 { 1.0 } else { 0.0 }).max(0.5);
        let mut base = 0;
        for (v, colour, what) in [
            (b.1, ALLOWED, "allowed"),
            (b.3, SHADOW, "shadow-limited"),
            (b.2, LIMITED, "limited"),
        ] {
            if v == 0 {
                continue;
            }
            let (top, bottom) = (y(base + v), y(base));
            let _ = write!(
                out,
                r#"<rect x="{x:.2}" y="{top:.2}" width="{w:.2}" height="{h:.2}" fill="{colour}"><title>{t}: {n} {what}</title></rect>"#,
                h = (bottom - top).max(0.5),
                t = minute_label(b.0),
                n = thousands(v)
            );
            base += v;
        }
    }
    // Time labels: first, middle, last bar.
    let n = bars.len();
    for (i, anchor) in [
        (0, "start"),
        (n / 2, "middle"),
        (n.saturating_sub(1), "end"),
    ] {
        if let Some(b) = bars.get(i) {
            let x = LEFT + i as f64 * bw + if anchor == "end" { bw } else { 0.0 };
            let _ = write!(
                out,
                r##"<text x="{x:.1}" y="{ty:.1}" font-size="11" text-anchor="{anchor}" fill="#555">{label}</text>"##,
                ty = HEIGHT - 8.0,
                label = minute_label(b.0)
            );
        }
    }
    let _ = write!(
        out,
        r##"<line x1="{LEFT}" y1="{yb:.1}" x2="{x2:.1}" y2="{yb:.1}" stroke="#888"/></svg>"##,
        yb = TOP + plot_h,
        x2 = WIDTH - 8.0
    );
}

fn offenders(out: &mut String, title: &str, list: &[Offender]) {
    if list.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "<h4>{}</h4><table><tr><th>identity</th><th>kind</th><th>requests</th><th>limited</th></tr>",
        esc(title)
    );
    for o in list {
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&o.identity),
            esc(&o.kind),
            thousands(o.requests),
            thousands(o.limited)
        );
    }
    out.push_str("</table>");
}

/// The report as an HTML page.
pub fn render(r: &Report) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let title = format!("tollgate simulate: {}", r.config);
    let _ = write!(
        out,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{t}</title><style>
body{{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}}
h1{{font-size:20px}} h2{{font-size:17px;margin-top:32px;border-bottom:1px solid #ccc}} h4{{margin:12px 0 4px}}
table{{border-collapse:collapse;margin:6px 0}} td,th{{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}}
td:first-child,th:first-child{{text-align:left}} code{{font-size:12px}}
.key span{{display:inline-block;width:12px;height:12px;margin:0 4px 0 14px;vertical-align:middle}}
.muted{{color:#666}}
</style></head><body><h1>{t}</h1>"#,
        t = esc(&title)
    );
    let i = &r.input;
    let _ = write!(
        out,
        r#"<p>{files} ({format}): {lines} lines, {requests} requests, {bad} bad, {skipped} skipped, {ooo} out of order. {span} Replayed in {secs:.2} s. {unrouted} unrouted, {refused} refused before routing.</p>"#,
        files = esc(&i.files.join(", ")),
        format = i.format,
        lines = thousands(i.lines),
        requests = thousands(i.requests),
        bad = thousands(i.bad_lines),
        skipped = thousands(i.skipped),
        ooo = thousands(i.out_of_order),
        span = match (&i.first, &i.last) {
            (Some(a), Some(b)) => format!("From {a} to {b}."),
            _ => String::new(),
        },
        secs = i.seconds,
        unrouted = thousands(r.unrouted),
        refused = thousands(r.refused),
    );
    if !i.bad_examples.is_empty() {
        out.push_str("<h4>Bad lines (first few)</h4><ul>");
        for b in &i.bad_examples {
            let _ = write!(
                out,
                "<li><code>{}:{}</code> {}</li>",
                esc(&b.file),
                b.line,
                esc(&b.error)
            );
        }
        out.push_str("</ul>");
    }
    if let Some(a) = &r.against {
        let _ = write!(
            out,
            "<p>Compared with <code>{}</code>: see the end of the page.</p>",
            esc(a)
        );
    }
    let first = r
        .routes
        .iter()
        .flat_map(|r| r.timeline.first())
        .map(|m| m.ts_ms)
        .min();
    let last = r
        .routes
        .iter()
        .flat_map(|r| r.timeline.last())
        .map(|m| m.ts_ms)
        .max();
    for route in &r.routes {
        let _ = write!(
            out,
            "<h2>Route {}</h2><p>{} requests, <b>{} limited</b> ({}), {} shadow-limited, {} rejected; {} callers, {} of them limited.</p>",
            esc(&route.name),
            thousands(route.requests),
            thousands(route.limited),
            percent(route.limited_share),
            thousands(route.shadow_limited),
            thousands(route.rejected),
            thousands(route.identities),
            thousands(route.identities_limited),
        );
        if let (Some(first), Some(last)) = (first, last)
            && route.requests > 0
        {
            let _ = write!(
                out,
                r#"<div class="key"><span style="background:{ALLOWED}"></span>allowed<span style="background:{SHADOW}"></span>shadow-limited<span style="background:{LIMITED}"></span>limited</div>"#
            );
            chart(&mut out, route, first, last);
        }
        if !route.limits.is_empty() {
            out.push_str("<table><tr><th>limit</th><th>quota</th><th>requests</th><th>limited</th><th>share</th><th>identities</th><th>limited ids</th><th>peak limited minute</th></tr>");
            for l in &route.limits {
                let _ = write!(
                    out,
                    "<tr><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(&l.name),
                    if l.shadow {
                        " <span class=muted>(shadow)</span>"
                    } else {
                        ""
                    },
                    esc(&l.quota),
                    thousands(l.requests),
                    thousands(l.limited),
                    percent(l.limited_share),
                    thousands(l.identities),
                    thousands(l.identities_limited),
                    l.peak_limited_minute.as_ref().map_or_else(
                        || "-".to_owned(),
                        |p| format!("{} ({})", p.minute, thousands(p.limited))
                    ),
                );
            }
            out.push_str("</table>");
        }
        offenders(&mut out, "Most limited callers", &route.top_offenders);
        for l in &route.limits {
            offenders(
                &mut out,
                &format!("Most limited by {}", l.name),
                &l.top_offenders,
            );
        }
    }
    if let Some(a) = &r.against {
        let _ = write!(
            out,
            "<h2>Against {}</h2><table><tr><th>route / limit</th><th>newly limited</th><th>no longer limited</th></tr>",
            esc(a)
        );
        for d in &r.diff {
            let _ = write!(
                out,
                "<tr><td>{}/{}</td><td>{}</td><td>{}</td></tr>",
                esc(&d.route),
                esc(&d.limit),
                thousands(d.newly_limited.count),
                thousands(d.no_longer_limited.count)
            );
        }
        out.push_str("</table>");
        for d in &r.diff {
            offenders(
                &mut out,
                &format!("{}/{}: newly limited", d.route, d.limit),
                &d.newly_limited.identities,
            );
            offenders(
                &mut out,
                &format!("{}/{}: no longer limited", d.route, d.limit),
                &d.no_longer_limited.identities,
            );
        }
    }
    out.push_str("</body></html>\n");
    out
}
