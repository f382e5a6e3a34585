//! prompt (in progress)
