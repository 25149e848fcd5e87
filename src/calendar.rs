//! Calendar periods in UTC, on the microsecond clock every decision uses: where a quota's period
//! starts and ends. `lua/token_bucket.lua` computes the same boundaries with the same integer steps
//! (`period_start`, `period_end`), so a quota resets at one instant whichever store decides.
//!
//! Months follow the proleptic Gregorian calendar (Howard Hinnant's `days_from_civil` and
//! `civil_from_days`), so month lengths and leap years are the calendar's, not a fixed 30 days.

const DAY_US: u64 = 86_400_000_000;

words! {
    /// A quota's period. Boundaries are UTC midnights.
    pub enum Period {
        Day = "day",
        /// ISO weeks: from Monday 00:00 UTC.
        Week = "week",
        Month = "month",
    }
}

impl Period {
    /// The first microsecond of the period that holds `t`.
    pub fn start(self, t: u64) -> u64 {
        let day = t / DAY_US;
        let first = match self {
            Period::Day => day,
            // 1970-01-01 was a Thursday, three days after a Monday (whose week is cut at the
            // epoch: the clock starts there).
            Period::Week => day.saturating_sub((day + 3) % 7),
            Period::Month => {
                let (y, m, _) = civil_from_days(day as i64);
                days_from_civil(y as u64, m, 1)
            }
        };
        first * DAY_US
    }

    /// The first microsecond of the next period after the one that holds `t`: the boundary where
    /// a quota is whole again.
    pub fn end(self, t: u64) -> u64 {
        let day = t / DAY_US;
        let next = match self {
            Period::Day => day + 1,
            Period::Week => day + 7 - (day + 3) % 7,
            Period::Month => {
                let (y, m, _) = civil_from_days(day as i64);
                let y = y as u64;
                if m == 12 {
                    days_from_civil(y + 1, 1, 1)
                } else {
                    days_from_civil(y, m + 1, 1)
                }
            }
        };
        next * DAY_US
    }

    /// The length in seconds of the period that holds `t` (28 to 31 days for a month).
    pub fn length_secs(self, t: u64) -> u64 {
        (self.end(t) - self.start(t)) / 1_000_000
    }
}

/// Days since 1970-01-01 of a date (`m` 1–12, `d` 1–31), for dates from 1970 on.
pub fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    // Shifted to 0000-03-01 so that the leap day ends the year, and to years that stay positive.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date (year, month 1–12, day 1–31) of a day since 1970-01-01 (before it too: X.509 times
/// may be).
pub fn civil_from_days(days: i64) -> (i64, u64, u64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m as u64, d as u64)
}

/// The microsecond that starts a date, UTC.
pub fn midnight(y: u64, m: u64, d: u64) -> u64 {
    days_from_civil(y, m, d) * DAY_US
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_dates_agree_for_four_centuries() {
        for day in 0..146_097 * 2 {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y as u64, m, d) as i64, day, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(-1), (1969, 12, 31), "before the epoch");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn months_have_the_calendars_lengths() {
        let len = |y, m| Period::Month.length_secs(midnight(y, m, 15)) / 86_400;
        assert_eq!(len(2027, 2), 28);
        assert_eq!(len(2028, 2), 29, "leap year");
        assert_eq!(len(2100, 2), 28, "a century is not a leap year");
        assert_eq!(len(2000, 2), 29, "unless it divides by 400");
        assert_eq!(len(2026, 12), 31);
        assert_eq!(len(2027, 4), 30);
    }

    #[test]
    fn boundaries_are_utc_midnights() {
        let feb29 = midnight(2028, 2, 29);
        assert_eq!(Period::Month.start(feb29 + 5), midnight(2028, 2, 1));
        assert_eq!(Period::Month.end(feb29 + 5), midnight(2028, 3, 1));
        assert_eq!(
            Period::Month.end(midnight(2028, 3, 1) - 1),
            midnight(2028, 3, 1)
        );
        assert_eq!(
            Period::Month.start(midnight(2028, 3, 1)),
            midnight(2028, 3, 1)
        );
        assert_eq!(
            Period::Month.end(midnight(2026, 12, 31)),
            midnight(2027, 1, 1)
        );
        assert_eq!(Period::Day.start(feb29 + DAY_US - 1), feb29);
        assert_eq!(Period::Day.end(feb29), midnight(2028, 3, 1));
    }

    #[test]
    fn weeks_start_on_monday() {
        // 2026-12-07 is a Monday; 2027-01-04 is the Monday of ISO week 1 of 2027.
        let monday = midnight(2026, 12, 7);
        for day in 0..7 {
            let t = monday + day * DAY_US + 12;
            assert_eq!(Period::Week.start(t), monday);
            assert_eq!(Period::Week.end(t), midnight(2026, 12, 14));
        }
        assert_eq!(
            Period::Week.start(midnight(2027, 1, 3)),
            midnight(2026, 12, 28)
        );
        assert_eq!(Period::Week.end(midnight(2027, 1, 3)), midnight(2027, 1, 4));
        assert_eq!(Period::Week.start(0), 0, "cut at the epoch");
        assert_eq!(Period::Week.end(0), midnight(1970, 1, 5));
    }
}
