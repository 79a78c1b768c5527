//! models
