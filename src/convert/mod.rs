//! convert (in progress)
