//! What a bad config reports: every problem, each naming file, line, route and field.

use std::fmt;

/// Why a config could not be loaded. Callers branch on it: a reload keeps the running config on
/// either variant, `--check` prints it and exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read the config: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", Problems(.0))]
    Invalid(Vec<Problem>),
}

impl ConfigError {
    /// Every problem found; empty for a read error.
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(p) => p,
            ConfigError::Read { .. } => &[],
        }
    }
}

/// One thing wrong with the config, with enough context to find it without reading the code:
/// `routes.yaml:12: route "api": routes[0].limits[0].capacity: must be an integer >= 1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    /// 1-based, where the YAML gives one.
    pub line: Option<usize>,
    /// The route's name, or `#<index>` when the route has no usable name.
    pub route: Option<String>,
    /// The path of the field, as `routes[0].limits[0].capacity`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(route) = &self.route {
            write!(f, ": route \"{route}\"")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

struct Problems<'a>(&'a [Problem]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}
