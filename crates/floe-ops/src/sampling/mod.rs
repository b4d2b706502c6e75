//! Tail-based trace sampling (issue 28, ADR 0011): whole traces kept or not by what happened
//! in them, decided in event time from state committed with the data.
//!
//! * [`policy`]: the policies (the OpenTelemetry Collector's `tail_sampling` set) and how
//!   they combine, over a [`policy::Summary`] of a trace's spans;
//! * [`probabilistic`]: the `probabilistic` policy's hash, the Collector's bit for bit.

pub mod config;
pub mod operator;
pub mod policy;
pub mod probabilistic;
