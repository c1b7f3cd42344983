//! The site agent's pure part, with no I/O: the site file ([`config`]) and what the agent decides of the offers
//! it is given and the attempts it runs ([`core`]). The agent binary (`meridian-agent`) runs it over NATS and
//! its backends; the simulator runs it in its own loop.

pub mod config;
pub mod core;
