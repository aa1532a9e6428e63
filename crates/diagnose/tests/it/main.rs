//! `diagnose` against real engines, a real gateway and real load: one situation per scenario.

mod prometheus;
mod scenarios;
mod support;
