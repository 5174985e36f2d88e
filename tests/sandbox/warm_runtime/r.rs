//! R programs of the warm runtime conformance suite: `commandArgs()`, the
//! script R reads through the runtime's FIFO (a `#!` line, a byte-order mark,
//! CRLF line endings, a script over 64 KiB, lines over R's 4 KiB console
//! buffer, parse errors on line one and later, `stdin()` being the script
//! itself), the search path, loaded namespaces, library paths and options,
//! the environment and locale, the working directory and the script as a
//! file, the global environment at the start, stdin through `file("stdin")`,
//! `readline()` and `scan()`, exits and exit hooks (`quit`, `q`, `.Last`,
//! finalizers), errors, warnings and conditions as R prints them, signals,
//! limits, ids, descriptors, temporary files and child processes.

use super::{Case, case};

/// The string literal `$s` eight times over, as one literal.
macro_rules! times8 {
    ($s:expr) => {
        concat!($s, $s, $s, $s, $s, $s, $s, $s)
    };
}

pub(super) const R: &[Case] = &[
    case("hello", "cat(\"hello\\n\")\n"),
    case(
        "command_args",
        "print(commandArgs())\n\
         print(commandArgs(trailingOnly = TRUE))\n\
         print(length(commandArgs(TRUE)))\n",
    ),
    case(
        "shebang_line",
        "#!/usr/bin/env Rscript\n\
         cat(\"after the #! line\\n\")\n\
         print(readLines(\"main.r\", n = 1))\n",
    ),
    case(
        "byte_order_mark",
        "\u{feff}cat(\"after a byte order mark\\n\")\n",
    ),
    case(
        "crlf_line_endings",
        "x <- 1\r\n\
         y <- \"two\"\r\n\
         cat(x, y, \"\\n\")\r\n\
         f <- function(a,\r\n\
         b) a + b\r\n\
         print(f(1, 2))\r\n\
         print(nchar(readLines(\"main.r\")[2]))\r\n",
    ),
    case(
        "long_script",
        concat!(
            "x <- 0L\n",
            times8!(times8!(times8!(times8!("x <- x + 1L # step\n")))),
            "cat(x, length(readLines(\"main.r\")), file.size(\"main.r\"), \"\\n\")\n"
        ),
    ),
    case(
        "long_lines",
        concat!(
            "x <- \"",
            times8!(times8!(times8!("aaaaaaaaaaaa"))),
            "\"\ncat(nchar(x), \"\\n\")\ny <- c(",
            times8!(times8!(times8!("1, 2, 3, 4, "))),
            "0)\ncat(length(y), sum(y), \"\\n\")\n"
        ),
    ),
    case(
        "long_non_ascii_line",
        concat!(
            "x <- \"",
            times8!(times8!(times8!("éééééé"))),
            "\"\ncat(nchar(x), \"\\n\")\n"
        ),
    ),
    case("syntax_error_on_line_one", "cat(1 +)\ncat(\"never\\n\")\n"),
    case(
        "syntax_error_later",
        "cat(\"first\\n\")\nx <- 1\nx <- )\ncat(\"never\\n\")\n",
    ),
    case(
        "unexpected_end_of_input",
        "cat(\"ok\\n\")\nf <- function() {\n  1\n",
    ),
    case(
        "error_at_top_level",
        "cat(\"before\\n\")\nstop(\"boom\")\ncat(\"never\\n\")\n",
    ),
    case(
        "error_in_a_function",
        "f <- function(x) g(x)\n\
         g <- function(x) h(x * 2)\n\
         h <- function(y) stop(\"deep: \", y)\n\
         cat(\"calling\\n\")\n\
         f(21)\n",
    ),
    case("error_on_line_one", "undefined_function_here(1)\n"),
    case(
        "warnings",
        "warning(\"top level\")\n\
         f <- function() { warning(\"first\"); warning(\"second\"); \"value\" }\n\
         print(f())\n\
         as.integer(\"x\")\n\
         for (i in 1:12) warning(paste(\"many\", i))\n\
         options(warn = 1)\n\
         warning(\"immediate\")\n\
         g <- function() warning(\"from g\")\n\
         g()\n\
         cat(\"done\\n\")\n",
    ),
    case(
        "quit_status",
        "cat(\"out\\n\")\nquit(status = 3)\ncat(\"never\\n\")\n",
    ),
    case(
        "q_positional",
        "f <- function() { on.exit(cat(\"on.exit of f\\n\")); q(\"no\", 5) }\n\
         f()\n\
         cat(\"never\\n\")\n",
    ),
    case("quit_status_wraps", "quit(status = 300)\n"),
    case(
        "exit_hooks",
        ".Last <- function() cat(\".Last ran\\n\")\n\
         e <- new.env()\n\
         reg.finalizer(e, function(e) cat(\"finalizer ran\\n\"), onexit = TRUE)\n\
         f <- function() { on.exit(cat(\"on.exit of f\\n\")); cat(\"in f\\n\"); invisible(1) }\n\
         f()\n\
         cat(\"quitting\\n\")\n\
         quit(status = 0)\n\
         cat(\"never\\n\")\n",
    ),
    case(
        "quit_without_last",
        ".Last <- function() cat(\".Last never ran\\n\")\n\
         e <- new.env()\n\
         invisible(reg.finalizer(e, function(e) cat(\"finalizer ran\\n\"), onexit = TRUE))\n\
         quit(runLast = FALSE, status = 2)\n",
    ),
    case(
        "error_and_exit_hooks",
        ".Last <- function() cat(\".Last ran\\n\")\n\
         e <- new.env()\n\
         invisible(reg.finalizer(e, function(e) cat(\"finalizer ran\\n\"), onexit = TRUE))\n\
         stop(\"halting\")\n",
    ),
    case(
        "search_path",
        "print(search())\n\
         print(getOption(\"defaultPackages\"))\n\
         print(sort(.packages()))\n",
    ),
    case(
        "loaded_namespaces",
        "print(sort(loadedNamespaces()))\n\
         print(isNamespaceLoaded(\"tools\"))\n\
         print(sort(names(.Options))[1:10])\n",
    ),
    case(
        "lib_paths_and_home",
        "print(.libPaths())\n\
         print(.Library)\n\
         print(.Library.site)\n\
         print(R.home())\n\
         print(R.home(\"bin\"))\n\
         print(Sys.getenv(c(\"R_LIBS\", \"R_LIBS_USER\", \"R_LIBS_SITE\", \"R_HOME\")))\n",
    ),
    case(
        "options",
        "str(options()[c(\"digits\", \"warn\", \"keep.source\", \"keep.source.pkgs\", \"encoding\", \"OutDec\",\n\
         \"echo\", \"width\", \"scipen\", \"expressions\", \"warning.length\", \"nwarnings\", \"useFancyQuotes\",\n\
         \"stringsAsFactors\", \"timeout\", \"verbose\", \"showErrorCalls\", \"show.error.messages\",\n\
         \"deparse.cutoff\", \"CBoundsCheck\", \"check.bounds\", \"max.print\", \"prompt\", \"continue\")])\n\
         print(sort(names(options())))\n\
         print(pi)\n\
         print(1e6)\n\
         print(123456789.123)\n",
    ),
    case(
        "environment",
        "env <- Sys.getenv()\n\
         keys <- sort(setdiff(names(env), c(\"HOSTNAME\", \"R_SESSION_TMPDIR\")))\n\
         for (k in keys) cat(k, \"=\", env[[k]], \"\\n\", sep = \"\")\n\
         cat(grepl(\"^/tmp/Rtmp\", Sys.getenv(\"R_SESSION_TMPDIR\")), \"\\n\")\n",
    ),
    case(
        "locale_and_encodings",
        "print(Sys.getlocale())\n\
         str(l10n_info())\n\
         print(Sys.timezone())\n\
         x <- \"naïve ✓ 😀\"\n\
         print(c(nchar(x), nchar(x, \"bytes\"), nchar(x, \"width\")))\n\
         print(Encoding(c(x, \"ascii\")))\n\
         print(charToRaw(\"é\"))\n\
         print(toupper(x))\n\
         print(utf8ToInt(\"é\"))\n\
         y <- iconv(\"naïve\", \"UTF-8\", \"latin1\")\n\
         print(c(Encoding(y), nchar(y, \"bytes\"), validUTF8(y)))\n\
         print(enc2native(x))\n\
         print(Sys.localeconv()[c(\"decimal_point\", \"thousands_sep\")])\n",
    ),
    case(
        "working_directory",
        "print(getwd())\n\
         print(list.files(\".\"))\n\
         print(list.files(\".\", all.files = TRUE))\n\
         tmp <- list.files(\"/tmp\", all.files = TRUE, no.. = TRUE)\n\
         print(length(tmp))\n\
         print(grepl(\"^Rtmp\", tmp))\n\
         print(file.exists(\"main.r\"))\n\
         print(normalizePath(\"main.r\"))\n\
         print(normalizePath(\".\"))\n\
         print(path.expand(\"~\"))\n",
    ),
    case(
        "own_source",
        "src <- readLines(\"main.r\")\n\
         print(src)\n\
         info <- file.info(\"main.r\")\n\
         print(c(info$size, file.size(\"main.r\"), nchar(paste(src, collapse = \"\\n\")) + 1))\n\
         print(info$isdir)\n\
         print(format(info$mode))\n\
         print(file.access(\"main.r\", 4))\n\
         print(Sys.umask())\n\
         print(file_test(\"-f\", \"main.r\"))\n",
    ),
    case(
        "top_level_frame",
        "print(ls(all.names = TRUE))\n\
         print(exists(\".Random.seed\"))\n\
         print(interactive())\n\
         print(sys.call())\n\
         print(sys.nframe())\n\
         print(sys.calls())\n\
         print(tryCatch(sys.function(), error = function(e) conditionMessage(e)))\n\
         print(environment())\n\
         print(environmentName(parent.frame()))\n\
         print(identical(environment(), globalenv()))\n\
         print(environmentName(parent.env(globalenv())))\n\
         print(.Last.value)\n\
         x <- 1\n\
         print(ls())\n",
    ),
    case(
        "random_numbers",
        "print(exists(\".Random.seed\", envir = globalenv()))\n\
         print(RNGkind())\n\
         set.seed(1)\n\
         print(runif(3))\n\
         print(sample(10))\n\
         print(rnorm(2))\n\
         set.seed(42, kind = \"Mersenne-Twister\")\n\
         print(round(rexp(3), 6))\n\
         print(length(.Random.seed))\n",
    ),
    Case {
        stdin: "one\ntwo\nthree",
        ..case(
            "stdin_lines",
            "x <- readLines(file(\"stdin\"))\n\
             print(x)\n\
             cat(toupper(x), sep = \"\\n\")\n\
             cat(\"|\\n\")\n",
        )
    },
    Case {
        stdin: "Ada\n7\n",
        ..case(
            "readline_and_stdin",
            "name <- readline(\"name? \")\n\
             print(name)\n\
             n <- readline(\"n? \")\n\
             print(n)\n\
             rest <- readLines(file(\"stdin\"))\n\
             print(rest)\n\
             cat(\"hi\", rest[1], as.integer(rest[2]) * 6, \"\\n\")\n",
        )
    },
    Case {
        stdin: "3 4.5 five\nsix\n",
        ..case(
            "scan_stdin",
            "x <- scan(file(\"stdin\"), what = \"\", quiet = TRUE)\n\
             print(x)\n\
             print(suppressWarnings(as.numeric(x)))\n",
        )
    },
    Case {
        stdin: "1 2 3\n4\n",
        ..case(
            "scan_numbers_stdin",
            "x <- scan(file(\"stdin\"))\nprint(sum(x))\n",
        )
    },
    case(
        "stdin_at_eof",
        "cat(\"waiting\\n\")\n\
         print(readLines(file(\"stdin\")))\n\
         print(scan(file(\"stdin\"), quiet = TRUE))\n\
         print(readline(\"> \"))\n\
         con <- file(\"stdin\")\n\
         open(con)\n\
         print(readLines(con, n = 1))\n\
         close(con)\n",
    ),
    Case {
        stdin: "real stdin\n",
        ..case(
            "stdin_connection_is_the_script",
            "cat(\"a\\n\")\n\
             x <- readLines(stdin(), n = 2)\n\
             print(x)\n\
             cat(\"not run: read as data\\n\")\n\
             # a comment line\n\
             print(x)\n\
             print(readLines(stdin()))\n\
             cat(\"also read as data\\n\")\n",
        )
    },
    case(
        "stdout_and_stderr",
        "cat(\"to out\\n\")\n\
         message(\"to err\")\n\
         cat(\"more err\\n\", file = stderr())\n\
         writeLines(\"written line\")\n\
         print(1:3)\n\
         message(\"no newline\", appendLF = FALSE)\n\
         cat(\"out again\\n\")\n\
         writeLines(\"err line\", con = stderr())\n",
    ),
    case(
        "data_frames_and_matrices",
        "print(head(mtcars))\n\
         m <- matrix(1:6, nrow = 2, dimnames = list(c(\"a\", \"b\"), NULL))\n\
         print(m)\n\
         print(t(m) %*% m)\n\
         df <- data.frame(x = 1:3, y = c(\"a\", \"b\", \"c\"), z = c(1.5, NA, 3))\n\
         print(df)\n\
         str(df)\n\
         print(summary(iris))\n\
         print(table(mtcars$cyl, mtcars$gear))\n\
         print(aggregate(mpg ~ cyl, data = mtcars, FUN = mean))\n\
         print(factor(c(\"lo\", \"hi\", \"lo\"), levels = c(\"lo\", \"hi\")))\n\
         print(list(a = 1, b = list(c = \"x\")))\n",
    ),
    Case {
        files: &[
            (
                "helper.r",
                "helper_value <- 42\n\
                 helper_file <- sys.frame(1)$ofile\n\
                 twice <- function(x) x * 2\n\
                 cat(\"helper loaded\\n\")\n",
            ),
            (
                "broken.r",
                "cat(\"broken starts\\n\")\n\
                 fail <- function() stop(\"inside broken\")\n\
                 fail()\n",
            ),
        ],
        ..case(
            "source_helper",
            "source(\"helper.r\")\n\
             print(helper_value)\n\
             print(helper_file)\n\
             print(twice(21))\n\
             source(\"helper.r\", echo = TRUE)\n\
             sys.source(\"helper.r\", envir = (e <- new.env()))\n\
             print(ls(e))\n\
             source(\"broken.r\")\n\
             cat(\"never\\n\")\n",
        )
    },
    case(
        "child_processes",
        "system(\"echo hi\")\n\
         x <- system(\"echo captured; echo to-err >&2\", intern = TRUE)\n\
         print(x)\n\
         print(system(\"exit 3\"))\n\
         print(system2(\"sh\", c(\"-c\", shQuote(\"exit 4\"))))\n\
         print(system2(\"echo\", c(\"a\", \"b\"), stdout = TRUE))\n\
         Sys.setenv(MY_VAR = \"set in R\")\n\
         system(\"echo MY_VAR=$MY_VAR\")\n\
         Sys.unsetenv(\"LANG\")\n\
         system(\"echo LANG=${LANG-unset}\")\n\
         out <- system2(\"Rscript\", c(\"--vanilla\", \"-e\", shQuote(\"cat(commandArgs(TRUE), interactive())\"), \"x\", \"y\"), stdout = TRUE)\n\
         print(out)\n\
         print(system(\"sh -c 'cat'\", input = c(\"piped\", \"lines\"), intern = TRUE))\n",
    ),
    case(
        "utils_and_tools",
        "print(tools::file_ext(\"main.r\"))\n\
         print(tools::file_path_sans_ext(\"dir/main.r\"))\n\
         print(tools::toTitleCase(\"hello world of r\"))\n\
         print(unname(tools::md5sum(\"main.r\")) == tools::md5sum(\"main.r\")[[\"main.r\"]])\n\
         print(utils::head(letters, 3))\n\
         print(utils::packageVersion(\"base\"))\n\
         print(utils::compareVersion(\"1.2.3\", \"1.10\"))\n\
         print(utils::capture.output(print(1:3)))\n\
         print(utils::type.convert(c(\"1\", \"2\"), as.is = TRUE))\n\
         print(nchar(utils::capture.output(utils::str(list(1)))))\n\
         print(isNamespaceLoaded(\"tools\"))\n",
    ),
    case(
        "version_and_capabilities",
        "cat(R.version.string, \"\\n\")\n\
         str(R.version[c(\"major\", \"minor\", \"language\", \"platform\", \"arch\", \"os\")])\n\
         print(.Platform[c(\"OS.type\", \"file.sep\", \"dynlib.ext\", \"endian\", \"path.sep\")])\n\
         print(.Machine$integer.max)\n\
         print(.Machine$double.eps)\n\
         print(capabilities())\n\
         print(extSoftVersion()[c(\"zlib\", \"PCRE\", \"iconv\")])\n\
         print(La_version())\n\
         print(Sys.info()[[\"sysname\"]])\n",
    ),
    case(
        "killed_by_sigterm",
        "cat(\"before\\n\")\n\
         tools::pskill(Sys.getpid(), tools::SIGTERM)\n\
         Sys.sleep(2)\n\
         cat(\"after\\n\")\n",
    ),
    case(
        "interrupted_by_sigint",
        "cat(\"before\\n\")\n\
         tools::pskill(Sys.getpid(), tools::SIGINT)\n\
         Sys.sleep(2)\n\
         cat(\"after\\n\")\n",
    ),
    case(
        "sigusr2",
        ".Last <- function() cat(\".Last ran\\n\")\n\
         cat(\"before\\n\")\n\
         tools::pskill(Sys.getpid(), tools::SIGUSR2)\n\
         Sys.sleep(2)\n\
         cat(\"after\\n\")\n",
    ),
    case(
        "interrupt_caught",
        "r <- tryCatch({\n\
         tools::pskill(Sys.getpid(), tools::SIGINT)\n\
         Sys.sleep(2)\n\
         \"not interrupted\"\n\
         }, interrupt = function(e) \"caught interrupt\")\n\
         print(r)\n",
    ),
    case(
        "resource_limits",
        "cat(readLines(\"/proc/self/limits\"), sep = \"\\n\")\n\
         invisible(system(\"ulimit -a\"))\n",
    ),
    case(
        "ids_and_session",
        "print(Sys.info()[[\"user\"]] != \"root\")\n\
         print(Sys.info()[[\"effective_user\"]] != \"root\")\n\
         stat <- strsplit(sub(\"^.*\\\\) \", \"\", readLines(\"/proc/self/stat\")), \" \")[[1]]\n\
         pid <- Sys.getpid()\n\
         print(c(as.integer(stat[3]) == pid, as.integer(stat[4]) == pid))\n\
         print(as.integer(stat[2]))\n\
         print(Sys.umask())\n\
         status <- readLines(\"/proc/self/status\")\n\
         ids <- sub(\"\\t.*\", \"\", sub(\"^[A-Za-z]+:\\t\", \"\", grep(\"^(Uid|Gid):\", status, value = TRUE)))\n\
         print(ids != \"0\")\n\
         print(grep(\"^(NoNewPrivs|Seccomp|CapEff|CapPrm|SigIgn|SigBlk):\", status, value = TRUE))\n",
    ),
    case(
        "descriptors",
        "print(list.files(\"/proc/self/fd\"))\n\
         con <- file(\"/dev/null\", \"r\")\n\
         print(list.files(\"/proc/self/fd\"))\n\
         close(con)\n\
         print(nrow(showConnections(all = TRUE)))\n\
         print(showConnections(all = TRUE)[1:3, c(\"description\", \"class\", \"mode\")])\n",
    ),
    case(
        "large_output",
        "cat(strrep(\"x\", 200000), \"\\n\", sep = \"\")\n\
         cat(\"end\\n\")\n",
    ),
    case("no_trailing_newline", "cat(\"partial\")\n"),
    case(
        "conditions",
        "print(tryCatch(stop(\"caught\"), error = function(e) conditionMessage(e)))\n\
         withCallingHandlers(\n\
         { warning(\"w1\"); cat(\"continued\\n\") },\n\
         warning = function(w) { message(\"handled: \", conditionMessage(w)); invokeRestart(\"muffleWarning\") })\n\
         r <- try(log(-1))\n\
         print(r)\n\
         r <- try(stop(\"tried\"))\n\
         print(class(r))\n\
         cat(r)\n\
         r <- try(stop(\"silent\"), silent = TRUE)\n\
         print(inherits(r, \"try-error\"))\n\
         f <- function() signalCondition(simpleCondition(\"custom\"))\n\
         print(f())\n\
         print(tryCatch(as.integer(\"x\"), warning = function(w) conditionMessage(w)))\n",
    ),
    case(
        "unicode_and_bytes",
        "cat(\"héllo ✓ 😀\\n\")\n\
         print(\"héllo ✓ 😀\")\n\
         print(\"tab\\there\")\n\
         print(c(a = \"é\", b = \"ü\"))\n\
         writeLines(\"\\u00e9\\u4e2d\")\n\
         con <- file(\"/dev/stdout\", \"wb\", raw = TRUE)\n\
         writeBin(as.raw(c(0x72, 0x61, 0x77, 0xff, 0xfe, 0x0a)), con)\n\
         close(con)\n\
         cat(\"end\\n\")\n",
    ),
    case(
        "temp_files",
        "td <- tempdir()\n\
         print(c(dir.exists(td), grepl(\"^/tmp/Rtmp\", td), length(list.files(td, all.files = TRUE, no.. = TRUE))))\n\
         tf <- tempfile(fileext = \".txt\")\n\
         writeLines(c(\"a\", \"b\"), tf)\n\
         print(c(startsWith(tf, td), file.exists(tf), length(list.files(td))))\n\
         writeLines(c(\"first\", \"second\"), \"/tmp/out.txt\")\n\
         print(readLines(\"/tmp/out.txt\"))\n\
         print(file.size(\"/tmp/out.txt\"))\n\
         print(unlink(\"/tmp/out.txt\"))\n\
         print(file.exists(\"/tmp/out.txt\"))\n",
    ),
    case(
        "infinite_recursion",
        "options(expressions = 500)\n\
         cat(\"recursing\\n\")\n\
         f <- function(n) f(n + 1)\n\
         f(0)\n",
    ),
    case(
        "keep_source",
        "f <- function(x) {\n\
         # a comment kept only with keep.source\n\
         x + 1  # trailing\n\
         }\n\
         print(f)\n\
         print(body(f))\n\
         print(is.null(attr(f, \"srcref\")))\n\
         print(deparse(quote(if (a) b else c)))\n\
         g <- function(x, ...) UseMethod(\"g\")\n\
         g.default <- function(x, ...) cat(\"default method\\n\")\n\
         g(1)\n\
         print(f(1))\n",
    ),
    case(
        "printing_numbers",
        "print(1/3)\n\
         print(c(1.5, NA, Inf, -Inf, NaN))\n\
         print(100000)\n\
         print(1e5 + 0.1)\n\
         print(1e-20)\n\
         print(.1 + .2 == .3)\n\
         print(format(1234567.891, big.mark = \",\"))\n\
         print(sprintf(\"%5.2f|%-5s|%03d\", pi, \"ab\", 7L))\n\
         print(seq(0, 1, by = 0.25))\n\
         print(1:30)\n\
         print(2^31)\n\
         print(bitwAnd(12L, 10L))\n",
    ),
];
