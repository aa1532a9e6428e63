//! The `spillway` command line, run as a user runs it.

mod commands;
