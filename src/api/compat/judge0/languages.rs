//! Judge0 CE's language ids (`db/languages/active.rb` of 1.13.1) for the
//! languages this server has. Several Judge0 ids name versions of one
//! language (C is 48, 49 and 50); each is accepted and listed, because
//! clients hard-code them (the judge0 SDK sends 52 for C++).

use crate::languages::{Language, LanguageCatalog};

/// Judge0 id → our language id.
pub(super) const JUDGE0_IDS: &[(u32, &str)] = &[
    (46, "bash"),
    (48, "c"),
    (49, "c"),
    (50, "c"),
    (51, "csharp"),
    (52, "cpp"),
    (53, "cpp"),
    (54, "cpp"),
    (59, "fortran"),
    (60, "go"),
    (61, "haskell"),
    (62, "java"),
    (63, "javascript"),
    (64, "lua"),
    (67, "pascal"),
    (68, "php"),
    (71, "python"),
    (72, "ruby"),
    (73, "rust"),
    (74, "typescript"),
    (78, "kotlin"),
    (80, "r"),
    (82, "sql"),
    (85, "perl"),
];

/// The language of a Judge0 id, if this server offers it.
pub(super) fn language_for(id: u32, catalog: &LanguageCatalog) -> Option<&Language> {
    JUDGE0_IDS
        .iter()
        .find(|(judge0, _)| *judge0 == id)
        .and_then(|(_, ours)| catalog.find(ours))
}

/// Every Judge0 id of the languages on offer, in id order.
pub(super) fn offered(catalog: &LanguageCatalog) -> Vec<(u32, &Language)> {
    JUDGE0_IDS
        .iter()
        .filter_map(|(id, ours)| catalog.find(ours).map(|l| (*id, l)))
        .collect()
}

/// A language's name as Judge0 writes it: the version inside the
/// parentheses (`C (GCC 12)`, `Python (3.11)`).
pub(super) fn judge0_name(language: &Language) -> String {
    match language.name.strip_suffix(')') {
        Some(head) => format!("{head} {})", language.version),
        None => format!("{} ({})", language.name, language.version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mapped_language_is_in_the_catalog_and_named_like_judge0() {
        let catalog = LanguageCatalog::embedded().unwrap();
        for (id, ours) in JUDGE0_IDS {
            assert!(catalog.find(ours).is_some(), "{id} → {ours}");
        }
        assert_eq!(judge0_name(catalog.find("c").unwrap()), "C (GCC 12)");
        assert_eq!(
            judge0_name(catalog.find("python").unwrap()),
            "Python (3.11)"
        );
        assert_eq!(language_for(54, &catalog).unwrap().id, "cpp");
        assert!(language_for(70, &catalog).is_none());
    }
}
