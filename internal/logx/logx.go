package logx

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"google.golang.org/grpc/grpclog"
)

// Formats of --log_format.
const (
	FormatText = "text"
	FormatJSON = "json"
)

// Options are the logging settings of a binary. Their yaml tags are the
// keys of the master's config file.
type Options struct {
	LogLevel  string `yaml:"log_level"`
	LogFormat string `yaml:"log_format"`
}

// Flags registers --log_level (default defLevel) and --log_format (default
// text) on fs, bound to the returned options.
func Flags(fs *flag.FlagSet, defLevel string) *Options {
	o := &Options{LogLevel: defLevel, LogFormat: FormatText}
	o.Register(fs)
	return o
}

// Register binds --log_level and --log_format to o, with o's current
// values as defaults.
func (o *Options) Register(fs *flag.FlagSet) {
	fs.StringVar(&o.LogLevel, "log_level", o.LogLevel, "debug, info, warn or error (logs go to stderr)")
	fs.StringVar(&o.LogFormat, "log_format", o.LogFormat, "text (key=value) or json (one object per line)")
}

// Validate refuses a level or a format the options do not know, in one
// line naming the flag (a *SettingError).
func (o *Options) Validate() error {
	if _, err := o.level(); err != nil {
		return &SettingError{Key: "log_level", Value: o.LogLevel, Want: "debug, info, warn or error"}
	}
	switch o.LogFormat {
	case FormatText, FormatJSON:
	default:
		return &SettingError{Key: "log_format", Value: o.LogFormat, Want: "text or json"}
	}
	return nil
}

// SettingError is a bad value of one setting. Error names it as a flag
// (--log_level "loud": want ...); a config file's loader may word it
// with Key alone.
type SettingError struct{ Key, Value, Want string }

func (e *SettingError) Error() string { return fmt.Sprintf("--%s %q: want %s", e.Key, e.Value, e.Want) }

// KeyError words e with the bare key, as the master words its settings
// (flags and YAML keys alike): log_level "loud": want ....
func (e *SettingError) KeyError() string {
	return fmt.Sprintf("%s %q: want %s", e.Key, e.Value, e.Want)
}

func (o *Options) level() (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(o.LogLevel))
	return l, err
}

// New returns a logger writing to w at o's level and in o's format. Options
// that do not validate give info and text.
func (o *Options) New(w io.Writer) *slog.Logger {
	return slog.New(o.Handler(w))
}

// Handler is New's handler.
func (o *Options) Handler(w io.Writer) slog.Handler {
	l, err := o.level()
	if err != nil {
		l = slog.LevelInfo
	}
	ho := &slog.HandlerOptions{Level: l}
	if strings.EqualFold(o.LogFormat, FormatJSON) {
		return slog.NewJSONHandler(w, ho)
	}
	return slog.NewTextHandler(w, ho)
}

// SetGlobal makes l the process's default logger (slog.SetDefault, which
// also sends the log package's output through it) and gRPC's logger. It
// is for a program's main, before any gRPC use: grpclog.SetLoggerV2 is
// not safe to call while gRPC runs.
func SetGlobal(l *slog.Logger) {
	slog.SetDefault(l)
	grpclog.SetLoggerV2(GRPC(l))
}

// Level is the options' level (info when it does not validate).
func (o *Options) Level() slog.Level {
	l, err := o.level()
	if err != nil {
		return slog.LevelInfo
	}
	return l
}
