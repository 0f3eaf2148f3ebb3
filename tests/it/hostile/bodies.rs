//! Whole bodies waiting for a busy host (issue 46, finding 1).
