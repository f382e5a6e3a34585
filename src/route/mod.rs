//! route (in progress)
