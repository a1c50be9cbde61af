//! The report as one self-contained HTML page: the summary, and per route
//! a chart of allowed against limited requests over time (inline SVG,
//! stacked bars, one per minute or per a few minutes for long logs), its
//! limits and its top offenders. No script, no font, nothing fetched.

use std::fmt::Write as _;

use super::report::{LimitDiff, LimitReport, MinuteOut, Offender, Report, RouteReport};
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

/// One bar: (start ms, allowed, limited, shadow-limited).
type Bar = (u64, u64, u64, u64);

/// The bars from minute `first` to `last`, and the minutes each stands for.
fn bars(t: &[MinuteOut], first: u64, last: u64) -> (u64, Vec<Bar>) {
    let minutes = (last - first) / 60_000 + 1;
    let per_bar = minutes.div_ceil(MAX_BARS).max(1);
    let n = minutes.div_ceil(per_bar) as usize;
    let mut out: Vec<Bar> = (0..n)
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

/// The geometry of one chart: the bars' width and the height of a value.
struct Plot {
    /// The tallest bar's total (at least 1).
    max: u64,
    /// One bar's width, with its gap.
    bw: f64,
    /// The height of the plotting area.
    plot_h: f64,
}

impl Plot {
    fn new(bars: &[Bar]) -> Self {
        let max = bars
            .iter()
            .map(|b| b.1 + b.2 + b.3)
            .max()
            .unwrap_or(0)
            .max(1);
        let plot_w = WIDTH - LEFT - 8.0;
        Self {
            max,
            bw: plot_w / bars.len() as f64,
            plot_h: HEIGHT - TOP - BOTTOM,
        }
    }

    /// The y coordinate of value `v`.
    fn y(&self, v: u64) -> f64 {
        TOP + self.plot_h - (v as f64 / self.max as f64) * self.plot_h
    }

    /// Grid and axis labels: 0, half, max.
    fn grid(&self, out: &mut String) {
        for v in [0, self.max / 2, self.max] {
            let yy = self.y(v);
            let _ = write!(
                out,
                r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{x2:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx:.1}" y="{ty:.1}" font-size="11" text-anchor="end" fill="#555">{label}</text>"##,
                x2 = WIDTH - 8.0,
                tx = LEFT - 6.0,
                ty = yy + 4.0,
                label = thousands(v)
            );
        }
    }

    /// The bars: allowed at the bottom, then shadow-limited, then limited.
    fn stacks(&self, out: &mut String, bars: &[Bar]) {
        for (i, b) in bars.iter().enumerate() {
            let x = LEFT + i as f64 * self.bw;
            let w = (self.bw - if self.bw > 3.0 { 1.0 } else { 0.0 }).max(0.5);
            let mut base = 0;
            for (v, colour, what) in [
                (b.1, ALLOWED, "allowed"),
                (b.3, SHADOW, "shadow-limited"),
                (b.2, LIMITED, "limited"),
            ] {
                if v == 0 {
                    continue;
                }
                let (top, bottom) = (self.y(base + v), self.y(base));
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
    }

    /// Time labels under the first, middle and last bar.
    fn time_axis(&self, out: &mut String, bars: &[Bar]) {
        let n = bars.len();
        for (i, anchor) in [
            (0, "start"),
            (n / 2, "middle"),
            (n.saturating_sub(1), "end"),
        ] {
            if let Some(b) = bars.get(i) {
                let x = LEFT + i as f64 * self.bw + if anchor == "end" { self.bw } else { 0.0 };
                let _ = write!(
                    out,
                    r##"<text x="{x:.1}" y="{ty:.1}" font-size="11" text-anchor="{anchor}" fill="#555">{label}</text>"##,
                    ty = HEIGHT - 8.0,
                    label = minute_label(b.0)
                );
            }
        }
    }
}

/// The chart of `route` from minute `first` to `last`, as inline SVG.
fn chart(out: &mut String, route: &RouteReport, first: u64, last: u64) {
    let (per_bar, bars) = bars(&route.timeline, first, last);
    let plot = Plot::new(&bars);
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="requests of route {name} per {per_bar} minute(s): allowed and limited">"#,
        name = esc(&route.name)
    );
    plot.grid(out);
    plot.stacks(out, &bars);
    plot.time_axis(out, &bars);
    let _ = write!(
        out,
        r##"<line x1="{LEFT}" y1="{yb:.1}" x2="{x2:.1}" y2="{yb:.1}" stroke="#888"/></svg>"##,
        yb = TOP + plot.plot_h,
        x2 = WIDTH - 8.0
    );
}

/// A table: a row of `head`ers, then `rows`, whose cells are HTML already.
fn table<const N: usize>(
    out: &mut String,
    head: [&str; N],
    rows: impl IntoIterator<Item = [String; N]>,
) {
    out.push_str("<table><tr>");
    for h in head {
        let _ = write!(out, "<th>{h}</th>");
    }
    out.push_str("</tr>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

/// A titled table of offenders (nothing when there are none).
fn offenders(out: &mut String, title: &str, list: &[Offender]) {
    if list.is_empty() {
        return;
    }
    let _ = write!(out, "<h4>{}</h4>", esc(title));
    table(
        out,
        ["identity", "kind", "requests", "limited"],
        list.iter().map(|o| {
            [
                format!("<code>{}</code>", esc(&o.identity)),
                esc(&o.kind),
                thousands(o.requests),
                thousands(o.limited),
            ]
        }),
    );
}

/// The report as an HTML page.
pub fn render(r: &Report) -> String {
    let mut out = String::with_capacity(64 * 1024);
    head(&mut out, r);
    summary(&mut out, r);
    let span = span(&r.routes);
    for route in &r.routes {
        route_section(&mut out, route, span);
    }
    if let Some(a) = &r.against {
        against(&mut out, a, &r.diff);
    }
    out.push_str("</body></html>\n");
    out
}

/// The page up to its title.
fn head(out: &mut String, r: &Report) {
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
}

/// What was read, the bad lines, and the `--against` note.
fn summary(out: &mut String, r: &Report) {
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
}

/// The first and last minute any route saw, which every chart spans.
fn span(routes: &[RouteReport]) -> Option<(u64, u64)> {
    let first = routes.iter().flat_map(|r| r.timeline.first());
    let last = routes.iter().flat_map(|r| r.timeline.last());
    Some((first.map(|m| m.ts_ms).min()?, last.map(|m| m.ts_ms).max()?))
}

/// One route: its numbers, its chart, its limits and top offenders.
fn route_section(out: &mut String, route: &RouteReport, span: Option<(u64, u64)>) {
    let _ = write!(
        out,
        "<h2>Route {}</h2><p>{} requests, <b>{} limited</b> ({}), {} shadow-limited, {} rejected, {} exempt; {} callers, {} of them limited.</p>",
        esc(&route.name),
        thousands(route.requests),
        thousands(route.limited),
        percent(route.limited_share),
        thousands(route.shadow_limited),
        thousands(route.rejected),
        thousands(route.exempt),
        thousands(route.identities),
        thousands(route.identities_limited),
    );
    if let Some((first, last)) = span
        && route.requests > 0
    {
        let _ = write!(
            out,
            r#"<div class="key"><span style="background:{ALLOWED}"></span>allowed<span style="background:{SHADOW}"></span>shadow-limited<span style="background:{LIMITED}"></span>limited</div>"#
        );
        chart(out, route, first, last);
    }
    if !route.limits.is_empty() {
        limits(out, &route.limits);
    }
    offenders(out, "Most limited callers", &route.top_offenders);
    for l in &route.limits {
        offenders(
            out,
            &format!("Most limited by {}", l.name),
            &l.top_offenders,
        );
    }
}

/// A route's limits as a table.
fn limits(out: &mut String, limits: &[LimitReport]) {
    let head = [
        "limit",
        "quota",
        "requests",
        "limited",
        "share",
        "identities",
        "limited ids",
        "peak limited minute",
    ];
    table(
        out,
        head,
        limits.iter().map(|l| {
            let shadow = if l.shadow {
                " <span class=muted>(shadow)</span>"
            } else {
                ""
            };
            [
                format!("{}{shadow}", esc(&l.name)),
                esc(&l.quota),
                thousands(l.requests),
                thousands(l.limited),
                percent(l.limited_share),
                thousands(l.identities),
                thousands(l.identities_limited),
                l.peak_limited_minute.as_ref().map_or_else(
                    || "-".to_owned(),
                    |p| format!("{} ({})", p.minute, thousands(p.limited)),
                ),
            ]
        }),
    );
}

/// The comparison with the `--against` file `a`: per limit, who changes
/// side.
fn against(out: &mut String, a: &str, diff: &[LimitDiff]) {
    let _ = write!(out, "<h2>Against {}</h2>", esc(a));
    table(
        out,
        ["route / limit", "newly limited", "no longer limited"],
        diff.iter().map(|d| {
            [
                format!("{}/{}", esc(&d.route), esc(&d.limit)),
                thousands(d.newly_limited.count),
                thousands(d.no_longer_limited.count),
            ]
        }),
    );
    for d in diff {
        offenders(
            out,
            &format!("{}/{}: newly limited", d.route, d.limit),
            &d.newly_limited.identities,
        );
        offenders(
            out,
            &format!("{}/{}: no longer limited", d.route, d.limit),
            &d.no_longer_limited.identities,
        );
    }
}
