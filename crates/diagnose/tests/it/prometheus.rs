//! The same situations through a real Prometheus server scraping the engine, its DCGM listener
//! and the gateway.
