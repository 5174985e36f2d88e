# code-runner's warm runtime for Ruby (see docs/warm-runtimes.md).
#
# Every ruby of this image's run command loads this file (`ruby -r` this
# file `main.rb`), cold ones included, so both list it in $LOADED_FEATURES
# and show the same command line. Ruby loads it after rubygems,
# error_highlight and did_you_mean, and before it parses its script. Only in
# a warm runtime (descriptor 200 is a pipe and the parent is the supervisor,
# PID 1) does it do anything. There the script Ruby opened is a FIFO the
# supervisor feeds: Ruby read its first byte before any of this could run
# and put it back; that byte is the supervisor's (0xEF), so this takes it
# back out of the script's buffer. (A runtime that opened its script only
# after the job's file had replaced the FIFO has that file open, whole: it
# takes nothing out.) Then it waits for the job's args (each followed by a
# NUL byte, then EOF), appends them to ARGV as a cold start has them
# (frozen), and closes the pipe. Ruby then parses the job's file from the
# FIFO, exactly as it would have read it from the file.
if File.pipe?("/proc/self/fd/200") && Process.ppid == 1
  script = nil
  ObjectSpace.each_object(File) do |file|
    script = file if !file.closed? && file.path == $0
  end
  unless script && (!script.stat.pipe? || script.getbyte == 0xEF)
    abort "code-runner: the warm runtime's script #{$0} is not the supervisor's FIFO"
  end
  control = IO.for_fd(200, autoclose: true)
  args = control.read.force_encoding(Encoding.default_external)
  control.close
  ARGV.concat(args.split("\0", -1)[0...-1].each(&:freeze))
end
