//! Fake clouds for berth's driver tests, each written from its cloud's
//! public API reference: OpenStack Nova, Google Compute Engine, Azure
//! Resource Manager and Hetzner Cloud. Each serves HTTP on 127.0.0.1:0
//! until dropped, keeps its own record of every machine it ever made (so a
//! test counts leaks and duplicates in the cloud's record, not berth's),
//! and counts the calls it answered by operation. What each follows and
//! what it leaves out is in this crate's README.
//!
//! They share [`common`]: serving, the calls counter, answers a test
//! injects, answers held back after their effect (a caller killed between
//! the two), and lists that lag behind creates (eventual consistency).

#![forbid(unsafe_code)]

pub mod azure;
pub mod common;
pub mod gce;
pub mod hetzner;
pub mod openstack;
