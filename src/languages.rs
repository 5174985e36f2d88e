//! The language catalog: `runner-images/languages.toml`, embedded in the binary
//! at build time and optionally replaced by a file given in the configuration.
//!
//! [`LanguageCatalog::find`] takes an id, an alias or a file extension; the
//! default set is what `scripts/build-images` builds; [`LanguageCatalog::only`]
//! narrows the catalog. The catalog is what the product knows; what is
//! *offered* is narrower: a worker keeps the languages whose images its
//! Docker has (`app::installed_catalog`, read once at start) and advertises
//! them with its heartbeat; an API offers what the live workers advertise,
//! the whole catalog until one has. The commands' placeholders (`{entry}`,
//! `{sources}`, …) are filled in by `job::prepare`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::job::limits::{CompileLimitsRequest, LimitsRequest};

/// The catalog the binary was built with.
pub const EMBEDDED_CATALOG: &str = include_str!("../runner-images/languages.toml");

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Language {
    pub id: String,
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    #[serde(default)]
    pub extensions: Vec<String>,
    pub image: String,
    pub source_file: String,
    #[serde(default)]
    pub compile: Option<Vec<String>>,
    pub run: Vec<String>,
    /// How a warm sandbox starts this language's runtime ahead of the job
    /// (see docs/warm-runtimes.md): the run command as it is started
    /// before the job, without the job's args; `None`: no warm runtime.
    #[serde(default)]
    pub warm_runtime: Option<Vec<String>>,
    /// The warm runtime opens its entry file at its start, before its hook
    /// waits (php): the supervisor makes it empty beforehand and
    /// writes the job's into that same file (`Prestart::preopened`).
    #[serde(default)]
    pub warm_runtime_opens_entry: bool,
    /// The warm runtime reads its entry file's first byte at its start and
    /// the rest once started up (ruby): the supervisor feeds it the job's
    /// file through a FIFO (`Prestart::fed`).
    #[serde(default)]
    pub warm_runtime_feeds_entry: bool,
    /// The fed runtime has no hook (R): it waits for its program by
    /// reading the FIFO, and takes only jobs without args
    /// (`Prestart::hookless`).
    #[serde(default)]
    pub warm_runtime_hookless: bool,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub limits: LimitsRequest,
    #[serde(default)]
    pub compile_limits: CompileLimitsRequest,
    /// Libraries the image carries, installed when it is built
    /// (`scripts/build-images`); a job still has no network.
    #[serde(default)]
    pub libraries: Vec<Library>,
}

/// Where a library of an image comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LibrarySource {
    /// A Debian package (`apt-get install name[=version]`).
    Debian,
    /// A Python package from PyPI (`pip install name==version`, wheels only).
    Pypi,
    /// A JavaScript package from npm (`npm install name@version`).
    Npm,
}

/// One library of a language's image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Library {
    /// The package's name in its source.
    pub name: String,
    /// The pinned version (required for PyPI and npm; a Debian package
    /// without one is the release's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub source: LibrarySource,
    /// What a program imports (`import numpy`, `require("lodash")`), when
    /// it is not the package's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<String>,
}

impl Library {
    /// Why this entry cannot be installed as written, if it cannot: names
    /// and versions go into a shell script at image build time, so only
    /// the characters of real package names and versions are accepted.
    fn problem(&self) -> Option<String> {
        let name_ok = match self.source {
            LibrarySource::Debian => is_token(&self.name, "+.-") && self.name.len() >= 2,
            LibrarySource::Pypi => is_token(&self.name, "._-"),
            LibrarySource::Npm => {
                let bare = match self.name.strip_prefix('@') {
                    Some(scoped) => match scoped.split_once('/') {
                        Some((scope, name)) if is_token(scope, "._-~") => name,
                        _ => "",
                    },
                    None => &self.name,
                };
                is_token(bare, "._-~") && !self.name.chars().any(|c| c.is_ascii_uppercase())
            }
        };
        if !name_ok {
            return Some(format!(
                "library name {:?} is not a valid {} package name",
                self.name,
                self.source.as_str()
            ));
        }
        match (&self.version, self.source) {
            (None, LibrarySource::Pypi | LibrarySource::Npm) => Some(format!(
                "library {} ({}) needs a pinned version",
                self.name,
                self.source.as_str()
            )),
            (Some(version), _) if !is_token(version, ".+~:_-") => Some(format!(
                "library {} has version {version:?}: only letters, digits and . + ~ : _ - are allowed",
                self.name
            )),
            _ => None,
        }
        .or_else(|| {
            self.import
                .as_deref()
                .filter(|import| !is_token(import, "._-/@"))
                .map(|import| format!("library {} has import {import:?}: not a module name", self.name))
        })
    }
}

impl LibrarySource {
    pub fn as_str(self) -> &'static str {
        match self {
            LibrarySource::Debian => "debian",
            LibrarySource::Pypi => "pypi",
            LibrarySource::Npm => "npm",
        }
    }
}

/// Whether `text` is non-empty, starts with a letter or digit and has only
/// letters, digits and the characters of `also`.
fn is_token(text: &str, also: &str) -> bool {
    text.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || also.contains(c))
}

impl Language {
    /// The image reference with its tag.
    pub fn image_ref(&self) -> String {
        if self.image.contains(':') {
            self.image.clone()
        } else {
            format!("{}:latest", self.image)
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    /// The languages `scripts/build-images` builds when none is named.
    #[serde(default)]
    default: Vec<String>,
    language: Vec<Language>,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("cannot read language catalog {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid language catalog: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("invalid language catalog: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone)]
pub struct LanguageCatalog {
    languages: Vec<Language>,
    default_set: Vec<String>,
}

impl LanguageCatalog {
    pub fn embedded() -> Result<Self, CatalogError> {
        Self::parse(EMBEDDED_CATALOG)
    }

    pub fn load(path: Option<&Path>) -> Result<Self, CatalogError> {
        match path {
            None => Self::embedded(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                Self::parse(&text)
            }
        }
    }

    pub fn parse(text: &str) -> Result<Self, CatalogError> {
        let file: CatalogFile = toml::from_str(text)?;
        let mut seen = BTreeMap::new();
        for language in &file.language {
            if language.run.is_empty() {
                return Err(CatalogError::Invalid(format!(
                    "language {} has an empty run command",
                    language.id
                )));
            }
            if language.warm_runtime.is_some() && language.compile.is_some() {
                return Err(CatalogError::Invalid(format!(
                    "language {} has a compile stage and a warm runtime; a warm runtime runs the job's first stage, which must be its run stage",
                    language.id
                )));
            }
            if language.warm_runtime_opens_entry && language.warm_runtime.is_none() {
                return Err(CatalogError::Invalid(format!(
                    "language {} sets warm_runtime_opens_entry without a warm_runtime",
                    language.id
                )));
            }
            if language.warm_runtime_feeds_entry && language.warm_runtime.is_none() {
                return Err(CatalogError::Invalid(format!(
                    "language {} sets warm_runtime_feeds_entry without a warm_runtime",
                    language.id
                )));
            }
            if language.warm_runtime_hookless && !language.warm_runtime_feeds_entry {
                return Err(CatalogError::Invalid(format!(
                    "language {} sets warm_runtime_hookless without warm_runtime_feeds_entry; only a fed runtime can wait without a hook",
                    language.id
                )));
            }
            if language.warm_runtime_feeds_entry && language.warm_runtime_opens_entry {
                return Err(CatalogError::Invalid(format!(
                    "language {} sets both warm_runtime_opens_entry and warm_runtime_feeds_entry; a runtime's entry file is either opened ahead or fed",
                    language.id
                )));
            }
            if language.warm_runtime.as_ref().is_some_and(Vec::is_empty) {
                return Err(CatalogError::Invalid(format!(
                    "language {} has an empty warm_runtime command",
                    language.id
                )));
            }
            if language.compile.as_ref().is_some_and(Vec::is_empty) {
                return Err(CatalogError::Invalid(format!(
                    "language {} has an empty compile command",
                    language.id
                )));
            }
            if let Some(problem) = language.libraries.iter().find_map(Library::problem) {
                return Err(CatalogError::Invalid(format!(
                    "language {}: {problem}",
                    language.id
                )));
            }
            for name in std::iter::once(&language.id).chain(&language.aliases) {
                if let Some(other) = seen.insert(name.to_lowercase(), language.id.clone()) {
                    return Err(CatalogError::Invalid(format!(
                        "name {name} is used by both {other} and {}",
                        language.id
                    )));
                }
            }
        }
        for id in &file.default {
            if !file.language.iter().any(|l| &l.id == id) {
                return Err(CatalogError::Invalid(format!(
                    "the default set names {id}, which is not a language"
                )));
            }
        }
        Ok(Self {
            languages: file.language,
            default_set: file.default,
        })
    }

    /// The languages built when an operator names none (`default`).
    pub fn default_set(&self) -> &[String] {
        &self.default_set
    }

    /// The same catalog with only the languages `keep` accepts, in the same
    /// order (the languages a worker has images of, say).
    pub fn only(&self, keep: impl Fn(&Language) -> bool) -> Self {
        Self {
            languages: self.languages.iter().filter(|l| keep(l)).cloned().collect(),
            default_set: self.default_set.clone(),
        }
    }

    pub fn all(&self) -> &[Language] {
        &self.languages
    }

    /// Finds a language by id or alias, ignoring case.
    pub fn find(&self, name: &str) -> Option<&Language> {
        let name = name.to_lowercase();
        self.languages
            .iter()
            .find(|l| l.id == name || l.aliases.iter().any(|a| a.to_lowercase() == name))
    }

    /// Finds the language a file name's extension selects.
    pub fn for_file_name(&self, file_name: &str) -> Option<&Language> {
        let extension = Path::new(file_name).extension()?.to_str()?.to_lowercase();
        self.languages
            .iter()
            .find(|l| l.extensions.contains(&extension))
    }

    pub fn ids(&self) -> Vec<&str> {
        self.languages.iter().map(|l| l.id.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_catalog_parses_and_has_the_required_languages() {
        let catalog = LanguageCatalog::embedded().unwrap();
        for id in ["python", "javascript", "c", "cpp", "bash"] {
            assert_eq!(catalog.find(id).map(|l| l.id.as_str()), Some(id));
        }
        assert_eq!(catalog.find("PY").unwrap().id, "python");
        assert_eq!(catalog.for_file_name("x/main.cc").unwrap().id, "cpp");
        assert!(catalog.find("cobol").is_none());
        assert_eq!(
            catalog.find("python").unwrap().image_ref(),
            "code-runner/python:latest"
        );
    }

    #[test]
    fn the_default_set_names_known_languages_and_only_filters() {
        let catalog = LanguageCatalog::embedded().unwrap();
        assert!(catalog.default_set().iter().any(|id| id == "python"));
        assert!(!catalog.default_set().iter().any(|id| id == "kotlin"));
        let some = catalog.only(|l| l.id == "c" || l.id == "java");
        assert_eq!(some.ids(), ["c", "java"]);
        assert!(some.find("python").is_none());
        let text = "default = [\"cobol\"]\n[[language]]\nid = \"a\"\nname = \"A\"\nversion = \"1\"\nimage = \"i\"\nsource_file = \"a\"\nrun = [\"a\"]\n";
        assert_eq!(
            LanguageCatalog::parse(text).unwrap_err().to_string(),
            "invalid language catalog: the default set names cobol, which is not a language"
        );
    }

    #[test]
    fn libraries_are_listed_and_a_bad_entry_is_refused_naming_it() {
        let catalog = LanguageCatalog::embedded().unwrap();
        let numpy = catalog
            .find("python")
            .unwrap()
            .libraries
            .iter()
            .find(|l| l.name == "numpy");
        assert_eq!(numpy.map(|l| l.source), Some(LibrarySource::Pypi));
        let entry = |library: &str| {
            format!(
                "[[language]]\nid = \"a\"\nname = \"A\"\nversion = \"1\"\nimage = \"i\"\n\
                 source_file = \"a\"\nrun = [\"a\"]\nlibraries = [{library}]\n"
            )
        };
        let refused = |library: &str| {
            LanguageCatalog::parse(&entry(library))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused(r#"{ name = "numpy", source = "pypi" }"#),
            "invalid language catalog: language a: library numpy (pypi) needs a pinned version"
        );
        assert_eq!(
            refused(r#"{ name = "lodash; rm -rf /", version = "1", source = "npm" }"#),
            "invalid language catalog: language a: library name \"lodash; rm -rf /\" is not a valid npm package name"
        );
        assert_eq!(
            refused(r#"{ name = "numpy", version = "1.0 && x", source = "pypi" }"#),
            "invalid language catalog: language a: library numpy has version \"1.0 && x\": only letters, digits and . + ~ : _ - are allowed"
        );
        assert!(
            refused(r#"{ name = "x", version = "1", source = "cran" }"#)
                .contains("unknown variant `cran`")
        );
        for good in [
            r#"{ name = "python3-scipy", source = "debian" }"#,
            r#"{ name = "libgmp-dev", version = "2:6.2.1+dfsg1-1.1", source = "debian" }"#,
            r#"{ name = "@types/node", version = "18.19.0", source = "npm" }"#,
            r#"{ name = "scikit-learn", version = "1.3.2", source = "pypi", import = "sklearn" }"#,
        ] {
            assert!(LanguageCatalog::parse(&entry(good)).is_ok(), "{good}");
        }
    }

    #[test]
    fn duplicate_alias_is_refused() {
        let text = r#"
[[language]]
id = "a"
name = "A"
version = "1"
aliases = ["x"]
image = "i"
source_file = "a"
run = ["a"]
[[language]]
id = "b"
name = "B"
version = "1"
aliases = ["X"]
image = "i"
source_file = "b"
run = ["b"]
"#;
        let error = LanguageCatalog::parse(text).unwrap_err().to_string();
        assert_eq!(
            error,
            "invalid language catalog: name X is used by both a and b"
        );
    }

    #[test]
    fn a_warm_runtime_is_either_opened_ahead_or_fed_and_only_with_a_command() {
        let entry = |extra: &str| {
            format!(
                "[[language]]\nid = \"rb\"\nname = \"R\"\nversion = \"1\"\nimage = \"i\"\nsource_file = \"main.rb\"\nrun = [\"ruby\", \"{{entry}}\"]\n{extra}"
            )
        };
        let fed = LanguageCatalog::parse(&entry(
            "warm_runtime = [\"ruby\", \"{entry}\"]\nwarm_runtime_feeds_entry = true\n",
        ))
        .unwrap();
        let language = fed.find("rb").unwrap();
        assert!(language.warm_runtime_feeds_entry && !language.warm_runtime_opens_entry);
        for (extra, error) in [
            (
                "warm_runtime_feeds_entry = true\n",
                "invalid language catalog: language rb sets warm_runtime_feeds_entry without a warm_runtime",
            ),
            (
                "warm_runtime = [\"ruby\"]\nwarm_runtime_feeds_entry = true\nwarm_runtime_opens_entry = true\n",
                "invalid language catalog: language rb sets both warm_runtime_opens_entry and warm_runtime_feeds_entry; a runtime's entry file is either opened ahead or fed",
            ),
            (
                "warm_runtime = [\"ruby\"]\nwarm_runtime_hookless = true\n",
                "invalid language catalog: language rb sets warm_runtime_hookless without warm_runtime_feeds_entry; only a fed runtime can wait without a hook",
            ),
        ] {
            let refused = LanguageCatalog::parse(&entry(extra))
                .unwrap_err()
                .to_string();
            assert_eq!(refused, error);
        }
        // The shipped catalog feeds ruby's, with the hook in both commands.
        let catalog = LanguageCatalog::embedded().unwrap();
        let ruby = catalog.find("ruby").unwrap();
        assert!(ruby.warm_runtime_feeds_entry && !ruby.warm_runtime_hookless);
        assert_eq!(ruby.warm_runtime.as_ref(), Some(&ruby.run));
        // R's is fed and waits by itself: the run command as it is.
        let r = catalog.find("r").unwrap();
        assert!(r.warm_runtime_feeds_entry && r.warm_runtime_hookless);
        assert_eq!(r.warm_runtime.as_ref(), Some(&r.run));
    }
}
