//! Ruby programs of the warm runtime conformance suite: `ARGV`, `$0` and
//! `__FILE__`, the script read through the runtime's FIFO (line one's
//! errors, byte-order marks, magic comments), the load path and loaded
//! features, the environment, stdio, exits and exit hooks, exceptions as
//! Ruby prints them (error_highlight, did_you_mean), signals, limits, ids,
//! descriptors, forks, threads and child interpreters.

use super::{Case, case};

pub(super) const RUBY: &[Case] = &[
    case("hello", "puts 'hello'\n"),
    Case {
        args: &["a", "b c", "ünï", "--flag", ""],
        ..case(
            "argv",
            "p ARGV, ARGV.equal?($*), ARGV.map { |a| [a.encoding, a.frozen?, a.valid_encoding?] }\n\
             p $0, $PROGRAM_NAME, __FILE__, __dir__, __LINE__, __method__, self\n",
        )
    },
    case(
        "script_as_a_file",
        "source = File.read(__FILE__)\n\
         p source.size, source.encoding, File.file?(__FILE__), File.size($0), File.stat(__FILE__).mode.to_s(8)\n\
         p File.expand_path(__FILE__), Dir.pwd, Dir.children('.').sort, Dir.children('/tmp').sort\n",
    ),
    case(
        "load_path_and_features",
        "p $LOAD_PATH\nputs $LOADED_FEATURES\np Gem.loaded_specs.keys.sort, defined?(DidYouMean), defined?(ErrorHighlight)\n",
    ),
    case(
        "top_level_state",
        "p local_variables, TOPLEVEL_BINDING.local_variables, instance_variables\n\
         p global_variables.sort, Object.constants.sort.size, private_methods(false).sort\n\
         p $VERBOSE, $DEBUG, $stdout.sync, $stderr.sync, $stdin.sync, $,, $/, $;\n",
    ),
    case(
        "environment",
        "puts ENV.to_h.sort.map { |k, v| \"#{k}=#{v}\" }\n",
    ),
    case(
        "encodings",
        "p __ENCODING__, Encoding.default_external, Encoding.default_internal, 'é'.encoding\n\
         p [$stdout, $stdin, $stderr].map { |io| [io.external_encoding, io.internal_encoding, io.tty?, io.fileno] }\n",
    ),
    Case {
        stdin: "one\ntwo\nthree",
        ..case(
            "stdin_lines",
            "$stdin.each_line { |line| print line.upcase }\nputs '|'\n",
        )
    },
    Case {
        stdin: "Ada\n7\n",
        ..case(
            "gets_prompts",
            "print 'name? '\nname = gets.chomp\nprint 'n? '\nn = gets.to_i\nputs \"hi #{name} #{n * 6}\"\n",
        )
    },
    case("gets_at_eof", "puts 'waiting'\np gets, $stdin.eof?\n"),
    case("exit_code", "puts 'out'\nexit 3\n"),
    case("abort_message", "print 'partial'\nabort 'bye now'\n"),
    case(
        "exit_bang_skips_hooks",
        "at_exit { puts 'never' }\n$stdout.sync = false\nprint 'x'\n$stdout.flush\nexit! 7\n",
    ),
    case(
        "exit_hooks_in_order",
        "BEGIN { puts 'begin' }\nEND { puts 'END block' }\nat_exit { puts 'first registered' }\n\
         at_exit { puts 'second registered'; exit 4 }\nputs 'body'\n",
    ),
    case(
        "uncaught_exception",
        "def inner = 1 / 0\ndef outer\n  inner\nend\nouter\n",
    ),
    case(
        "chained_exceptions",
        "begin\n  {}.fetch(:key)\nrescue KeyError\n  raise ArgumentError, 'bad value'\nend\n",
    ),
    case("error_on_line_one", "nil.upcase\n"),
    case("did_you_mean_on_line_one", "message = 1; puts mesage\n"),
    case("syntax_error_on_line_one", "puts(1 +)\n"),
    case("syntax_error_later", "x = 1\nif x\n  puts 'open'\n"),
    case(
        "end_of_script_marker",
        "puts 'before'\n\u{4}\nputs 'after, never parsed'\n",
    ),
    case(
        "byte_order_mark",
        "\u{feff}puts __LINE__, 'é'.encoding, File.binread(__FILE__).bytes.first(3).inspect\n",
    ),
    case(
        "magic_comments",
        "# encoding: ascii-8bit\n# frozen_string_literal: true\np __ENCODING__, 'x'.frozen?, 'é'.bytesize\n",
    ),
    case(
        "comment_first_line",
        "# a comment, not #!\np __LINE__, caller_locations(0).map(&:to_s)\n",
    ),
    case("stack_overflow", "def down(n) = down(n + 1)\ndown(0)\n"),
    case(
        "warnings",
        "warn 'careful'\nWarning.warn(\"direct\\n\")\nif (a = 1) then end\nputs 'done'\n",
    ),
    Case {
        files: &[(
            "helper.rb",
            "VALUE = 42\nputs \"helper loaded #{__FILE__}\"\n",
        )],
        ..case(
            "require_from_workspace",
            "require_relative 'helper'\np VALUE, $LOADED_FEATURES.last\nrequire 'json'\nputs JSON.generate([1, 'a'])\n",
        )
    },
    case(
        "resource_limits",
        "%i[CPU FSIZE NOFILE CORE NPROC AS STACK DATA MEMLOCK].each { |r| p [r, Process.getrlimit(r)] }\n",
    ),
    case(
        "ids_and_session",
        "uid = Process.uid\np uid != 0, [Process.euid, Process.gid, Process.egid].all?(uid), Process.groups\n\
         p Process.ppid, Process.getpgrp == $$, Process.getsid == $$, File.umask\n",
    ),
    case(
        "descriptors",
        "p Dir.children('/proc/self/fd').map(&:to_i).sort\n\
         f = File.open('/dev/null')\np f.fileno, ObjectSpace.each_object(File).count { |io| !io.closed? && io.path == $0 }\n",
    ),
    case(
        "signal_handlers",
        "p %w[INT TERM PIPE CHLD HUP QUIT].map { |s| [s, trap(s, 'SYSTEM_DEFAULT')] }\n",
    ),
    case(
        "killed_by_its_own_signal",
        "puts 'before'\n$stdout.flush\nProcess.kill(:TERM, $$)\nsleep 1\nputs 'after'\n",
    ),
    case("interrupt", "puts 'start'\nraise Interrupt\n"),
    case(
        "trapped_signal",
        "trap('USR1') { puts 'got usr1' }\nProcess.kill(:USR1, $$)\nsleep 0.2\nputs 'after'\n",
    ),
    case(
        "child_ruby",
        "out = IO.popen(['ruby', '-e', 'p ARGV, $0', 'x'], err: [:child, :out], &:read)\np out, $?.exitstatus\n",
    ),
    case(
        "fork",
        "pid = fork { puts 'child'; exit! 5 }\nProcess.wait(pid)\np ['parent', $?.exitstatus]\n",
    ),
    case(
        "threads",
        "out = Queue.new\n4.times.map { |i| Thread.new { out << i } }.each(&:join)\n\
         p 4.times.map { out.pop }.sort, Thread.list.size, Thread.main == Thread.current\n",
    ),
    case(
        "unicode_and_bytes",
        "puts 'héllo ✓ 😀'\n$stdout.flush\n$stdout.write(\"\\xff\\xfe raw\\n\".b)\n",
    ),
    case("large_output", "puts 'x' * 200_000\nputs 'end'\n"),
    case("no_trailing_newline", "print 'partial'\n"),
    case(
        "stdout_and_stderr",
        "puts 'to out'\n$stderr.puts 'to err'\nSTDOUT.write(\"raw out\\n\")\n",
    ),
    case(
        "eval_tracebacks",
        "eval(\"def f\\n  raise IndexError, 'inside'\\nend\\nf\\n\", binding, 'virtual.rb', 10)\n",
    ),
    case(
        "garbage_collector_settings",
        "p GC.stress, GC::INTERNAL_CONSTANTS[:RVALUE_SIZE], RubyVM::OPTS, RubyVM.keep_script_lines\n",
    ),
];
