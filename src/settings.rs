//! settings (in progress)
