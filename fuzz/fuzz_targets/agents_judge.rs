//! Any bytes as events of the agents' streams (Responses, Messages), read as the relay reads them:
//! no panic, and the gateway's rewrite of each event (the public model name) reads the same as the
//! event it came from (`spillway_gateway::event::check_agents`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| spillway_gateway::event::check_agents(data));
