//! server (in progress)
