# code-runner's warm runtime for Ruby (see docs/warm-runtimes.md).
#
# Loaded by the line the image appends to rubygems' operating_system.rb, and
# only when descriptor 200 is a pipe: the supervisor started `ruby main.rb`
# before the job came, with its control pipe as descriptor 200. Ruby has then
# done its whole start-up (rubygems included) and opened main.rb, an empty
# file the supervisor made, but has not read it. This waits for the job's args
# (each followed by a NUL byte, then EOF), puts them in ARGV as a cold start
# has them (frozen, in the locale's encoding), closes the pipe and returns;
# meanwhile the supervisor wrote the job's main.rb into that same file. Ruby
# then reads and runs it exactly as on a cold start: same $0, __FILE__,
# backtraces, at_exit and exit status. `load` leaves no trace in
# $LOADED_FEATURES, and these locals are this file's own.
control = IO.for_fd(200, "rb", autoclose: true)
begin
  args = control.read.split("\0", -1)
ensure
  control.close
end
args.pop
locale = Encoding.find("locale")
ARGV.concat(args.map { |arg| arg.force_encoding(locale).freeze })
