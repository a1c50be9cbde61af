//! The report as text for a terminal: a summary of what was read, a table
//! of routes with their limits under each, the top offenders, and with
//! `--against` who changes side.

use std::fmt::Write as _;

use super::report::{LimitDiff, LimitReport, Offender, Peak, Report, RouteReport};

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A share as a percentage with two decimals.
pub fn percent(share: f64) -> String {
    format!("{:.2}%", share * 100.0)
}

fn peak(p: Option<&Peak>) -> String {
    p.map_or_else(
        || "-".to_owned(),
        |p| {
            format!(
                "{} ({}/{})",
                p.minute,
                thousands(p.requests),
                thousands(p.limited)
            )
        },
    )
}

/// Rows laid out in columns: the first left-aligned, the rest right.
fn columns(out: &mut String, indent: &str, rows: &[Vec<String>]) {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::from(indent);
        for (i, cell) in row.iter().enumerate() {
            if i == 0 {
                let _ = write!(line, "{cell:<w$}", w = widths[i]);
            } else {
                let _ = write!(line, "  {cell:>w$}", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

fn offenders(out: &mut String, indent: &str, title: &str, list: &[Offender]) {
    if list.is_empty() {
        return;
    }
    let _ = writeln!(out, "{indent}{title}");
    let mut rows = vec![vec![
        "identity".to_owned(),
        "kind".to_owned(),
        "requests".to_owned(),
        "limited".to_owned(),
    ]];
    rows.extend(list.iter().map(|o| {
        vec![
            o.identity.clone(),
            o.kind.clone(),
            thousands(o.requests),
            thousands(o.limited),
        ]
    }));
    columns(out, &format!("{indent}  "), &rows);
}

/// The report as text.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    summary(&mut out, r);
    out.push('\n');
    columns(&mut out, "", &route_rows(&r.routes));
    top_offenders(&mut out, &r.routes);
    if let Some(a) = &r.against {
        against(&mut out, a, &r.diff);
    }
    out
}

/// The title, what was read, the refusals and the bad lines.
fn summary(out: &mut String, r: &Report) {
    let i = &r.input;
    let _ = write!(out, "tollgate simulate: {}", r.config);
    if let Some(a) = &r.against {
        let _ = write!(out, " against {a}");
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "input: {} ({}): {} lines, {} requests, {} bad, {} skipped, {} out of order",
        i.files.join(", "),
        i.format,
        thousands(i.lines),
        thousands(i.requests),
        thousands(i.bad_lines),
        thousands(i.skipped),
        thousands(i.out_of_order),
    );
    if let (Some(first), Some(last)) = (&i.first, &i.last) {
        let _ = writeln!(out, "time: {first} .. {last}");
    }
    let _ = writeln!(
        out,
        "replayed in {:.2} s ({} lines/s); {} unrouted, {} refused before routing",
        i.seconds,
        thousands(i.lines_per_second as u64),
        thousands(r.unrouted),
        thousands(r.refused),
    );
    for e in &r.refused_examples {
        let _ = writeln!(out, "  refused: {e}");
    }
    if i.bad_lines > 0 {
        let _ = writeln!(
            out,
            "bad lines ({}, first {}):",
            thousands(i.bad_lines),
            i.bad_examples.len()
        );
        for b in &i.bad_examples {
            let _ = writeln!(out, "  {}:{}: {}", b.file, b.line, b.error);
        }
    }
}

/// The table of routes, each followed by its limits.
fn route_rows(routes: &[RouteReport]) -> Vec<Vec<String>> {
    let mut rows = vec![vec![
        "route / limit".to_owned(),
        "quota".to_owned(),
        "requests".to_owned(),
        "limited".to_owned(),
        "share".to_owned(),
        "identities".to_owned(),
        "limited ids".to_owned(),
        "peak minute (req/limited)".to_owned(),
    ]];
    for route in routes {
        rows.push(route_row(route));
        rows.extend(route.limits.iter().map(limit_row));
    }
    rows
}

/// A route's row: its name with what else befell its requests, no quota.
fn route_row(route: &RouteReport) -> Vec<String> {
    let extra = [
        (route.shadow_limited, "shadow-limited"),
        (route.rejected, "rejected"),
        (route.exempt, "exempt"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!(" +{} {what}", thousands(*n)))
    .collect::<String>();
    vec![
        format!("{}{extra}", route.name),
        String::new(),
        thousands(route.requests),
        thousands(route.limited),
        percent(route.limited_share),
        thousands(route.identities),
        thousands(route.identities_limited),
        peak(
            route
                .peak_limited_minute
                .as_ref()
                .or(route.peak_minute.as_ref()),
        ),
    ]
}

/// A limit's row, indented under its route.
fn limit_row(l: &LimitReport) -> Vec<String> {
    vec![
        format!("  {}{}", l.name, if l.shadow { " (shadow)" } else { "" }),
        l.quota.clone(),
        thousands(l.requests),
        thousands(l.limited),
        percent(l.limited_share),
        thousands(l.identities),
        thousands(l.identities_limited),
        peak(l.peak_limited_minute.as_ref().or(l.peak_minute.as_ref())),
    ]
}

/// Per route with any, the most limited callers and identities per limit.
fn top_offenders(out: &mut String, routes: &[RouteReport]) {
    for route in routes {
        let any = !route.top_offenders.is_empty()
            || route.limits.iter().any(|l| !l.top_offenders.is_empty());
        if !any {
            continue;
        }
        let _ = writeln!(out, "\ntop offenders on {}:", route.name);
        offenders(out, "  ", "callers of the route:", &route.top_offenders);
        for l in &route.limits {
            offenders(out, "  ", &format!("limit {}:", l.name), &l.top_offenders);
        }
    }
}

/// The comparison with the `--against` file `a`: per limit, who changes
/// side.
fn against(out: &mut String, a: &str, diff: &[LimitDiff]) {
    let _ = writeln!(out, "\nagainst {a}:");
    for d in diff {
        let _ = writeln!(
            out,
            "  {}/{}: {} newly limited, {} no longer limited",
            d.route,
            d.limit,
            thousands(d.newly_limited.count),
            thousands(d.no_longer_limited.count)
        );
        offenders(out, "    ", "newly limited:", &d.newly_limited.identities);
        offenders(
            out,
            "    ",
            "no longer limited (denials under the old file):",
            &d.no_longer_limited.identities,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(percent(0.01234), "1.23%");
    }
}
