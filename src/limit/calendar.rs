//! Calendar months in UTC, for monthly quotas (`window: month`).
//!
//! Days, hours and `30d` windows are whole multiples of a millisecond count
//! from the Unix epoch, which started at UTC midnight, and Unix time has no
//! leap seconds — so `window: 1d` is already a UTC day. Months are not of
//! one length, so they get their own index: months since January 1970.
//! The conversions are the proleptic-Gregorian day arithmetic of
//! [`clock::days_from_civil`] / [`clock::civil_from_days`].

use crate::clock;

const DAY_MS: u64 = 86_400_000;

/// Days since 1970-01-01 of the first day of `month` (1–12) in `year`.
fn days_from_civil(year: u64, month: u64) -> u64 {
    let days = clock::days_from_civil(year as i64, month as u32, 1);
    u64::try_from(days).unwrap_or(0)
}

/// (year, month 1–12) of the day `days` since 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64) {
    let (year, month, _) = clock::civil_from_days(days as i64);
    (year as u64, u64::from(month))
}

/// Months since January 1970 at `now_ms`.
pub fn month_index(now_ms: u64) -> u64 {
    let (year, month) = civil_from_days(now_ms / DAY_MS);
    (year - 1970) * 12 + (month - 1)
}

/// The first millisecond of month `index` (months since January 1970).
pub fn month_start_ms(index: u64) -> u64 {
    let year = 1970 + index / 12;
    let month = index % 12 + 1;
    days_from_civil(year, month) * DAY_MS
}

/// The month `now_ms` is in and the millisecond its successor starts.
pub fn month(now_ms: u64) -> (u64, u64) {
    let index = month_index(now_ms);
    (index, month_start_ms(index + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_months() {
        // 1970-01-01, 2000-03-01 (leap century), 2024-02-01 and 2024-03-01
        // (leap February), 2023-12-01.
        assert_eq!(month_start_ms(0), 0);
        assert_eq!(month_start_ms(30 * 12 + 2), 951_868_800_000);
        assert_eq!(month_start_ms(54 * 12 + 1), 1_706_745_600_000);
        assert_eq!(month_start_ms(54 * 12 + 2), 1_709_251_200_000);
        assert_eq!(month_start_ms(53 * 12 + 11), 1_701_388_800_000);
        // 2023-11-14T22:00:00Z is in November 2023, which ends on Dec 1.
        assert_eq!(month(1_699_999_200_000), (53 * 12 + 10, 1_701_388_800_000));
    }

    #[test]
    fn index_and_start_agree_for_every_month_to_2200() {
        for i in 0..(230 * 12) {
            let start = month_start_ms(i);
            assert_eq!(month_index(start), i);
            if i > 0 {
                assert_eq!(month_index(start - 1), i - 1);
            }
            let len_days = (month_start_ms(i + 1) - start) / DAY_MS;
            assert!((28..=31).contains(&len_days), "month {i}: {len_days} days");
        }
    }
}
