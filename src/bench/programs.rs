//! The programs `bench` runs when no `--program` is given: per language, a
//! hello world that prints `42`, and for `--interactive` an echo program
//! that prints `ready`, then writes back each line it reads, flushing each.

/// `(language id, hello world, interactive echo)`.
const BUILT_IN: &[(&str, &str, &str)] = &[
    (
        "python",
        "print(42)\n",
        "print('ready', flush=True)\n\
         while True:\n\
         \x20   try:\n\
         \x20       line = input()\n\
         \x20   except EOFError:\n\
         \x20       break\n\
         \x20   print(line, flush=True)\n",
    ),
    (
        "javascript",
        "console.log(42);\n",
        "console.log('ready');\n\
         const lines = require('readline').createInterface({ input: process.stdin });\n\
         lines.on('line', (line) => process.stdout.write(line + '\\n'));\n",
    ),
    (
        "bash",
        "echo 42\n",
        "echo ready\nwhile IFS= read -r line; do printf '%s\\n' \"$line\"; done\n",
    ),
    (
        "ruby",
        "puts 42\n",
        "STDOUT.sync = true\nputs 'ready'\nwhile (line = STDIN.gets)\n  print line\nend\n",
    ),
    (
        "c",
        "#include <stdio.h>\nint main(void) { puts(\"42\"); return 0; }\n",
        "#include <stdio.h>\n\
         int main(void) {\n\
         \x20   char line[4096];\n\
         \x20   setvbuf(stdout, NULL, _IOLBF, 0);\n\
         \x20   puts(\"ready\");\n\
         \x20   while (fgets(line, sizeof line, stdin)) fputs(line, stdout);\n\
         \x20   return 0;\n\
         }\n",
    ),
    (
        "cpp",
        "#include <iostream>\nint main() { std::cout << 42 << std::endl; }\n",
        "#include <iostream>\n#include <string>\n\
         int main() {\n\
         \x20   std::string line;\n\
         \x20   std::cout << \"ready\" << std::endl;\n\
         \x20   while (std::getline(std::cin, line)) std::cout << line << std::endl;\n\
         }\n",
    ),
    (
        "go",
        "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(42) }\n",
        "package main\n\n\
         import (\n\t\"bufio\"\n\t\"fmt\"\n\t\"os\"\n)\n\n\
         func main() {\n\
         \tfmt.Println(\"ready\")\n\
         \tlines := bufio.NewScanner(os.Stdin)\n\
         \tfor lines.Scan() {\n\
         \t\tfmt.Println(lines.Text())\n\
         \t}\n\
         }\n",
    ),
];

/// The built-in program for a language id: the echo program when
/// `interactive`, the hello world otherwise.
pub(super) fn built_in(language: &str, interactive: bool) -> Option<&'static str> {
    BUILT_IN
        .iter()
        .find(|(id, _, _)| *id == language)
        .map(|(_, hello, echo)| if interactive { *echo } else { *hello })
}

/// The languages that have built-in programs.
pub(super) fn languages() -> Vec<&'static str> {
    BUILT_IN.iter().map(|(id, _, _)| *id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::languages::LanguageCatalog;

    #[test]
    fn every_built_in_language_is_in_the_catalog() {
        let catalog = LanguageCatalog::embedded().unwrap();
        for id in languages() {
            assert!(catalog.find(id).is_some(), "{id} is not in the catalog");
        }
        assert_eq!(built_in("python", false), Some("print(42)\n"));
        assert!(built_in("python", true).unwrap().contains("input()"));
        assert_eq!(built_in("cobol", false), None);
    }
}
