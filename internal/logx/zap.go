package logx

import (
	"context"
	"log/slog"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Zap returns a zap logger writing slog records to l's handler, each
// with component=component; a nil l follows slog.Default() at every
// write (so a logger built before slog.SetDefault still follows it).
// zap's levels map to slog's (info to info); Quiet lowers them.
func Zap(l *slog.Logger, component string) *zap.Logger {
	return zap.New(&zapCore{l: l, attrs: []slog.Attr{slog.String("component", component)}})
}

// ZapQuiet is Zap with every level lowered one step (info to debug, warn
// to info, error stays error): for an embedded etcd server, a fixture
// whose routine warnings (slow applies on a loaded machine) are not the
// operator's concern.
func ZapQuiet(l *slog.Logger, component string) *zap.Logger {
	return zap.New(&zapCore{l: l, quiet: true, attrs: []slog.Attr{slog.String("component", component)}})
}

type zapCore struct {
	l     *slog.Logger // nil: slog.Default()
	quiet bool
	attrs []slog.Attr // from With, in order
}

func (c *zapCore) handler() slog.Handler {
	if c.l == nil {
		return slog.Default().Handler()
	}
	return c.l.Handler()
}

func (c *zapCore) level(z zapcore.Level) slog.Level {
	var l slog.Level
	switch {
	case z <= zapcore.DebugLevel:
		l = slog.LevelDebug
	case z == zapcore.InfoLevel:
		l = slog.LevelInfo
	case z == zapcore.WarnLevel:
		l = slog.LevelWarn
	default: // error, dpanic, panic, fatal: zap itself panics or exits after
		return slog.LevelError
	}
	if c.quiet {
		l -= 4
	}
	return l
}

func (c *zapCore) Enabled(z zapcore.Level) bool {
	return c.handler().Enabled(context.Background(), c.level(z))
}

func (c *zapCore) With(fs []zapcore.Field) zapcore.Core {
	return &zapCore{l: c.l, quiet: c.quiet, attrs: append(slices.Clip(c.attrs), fieldAttrs(fs)...)}
}

func (c *zapCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *zapCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	r := slog.NewRecord(e.Time, c.level(e.Level), e.Message, 0)
	r.AddAttrs(c.attrs...)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(fieldAttrs(fs)...)
	return c.handler().Handle(context.Background(), r)
}

func (c *zapCore) Sync() error { return nil }

// fieldAttrs turns zap fields into slog attributes, in the fields' order
// (zap's map encoder gives each field's value as plain Go data).
func fieldAttrs(fs []zapcore.Field) []slog.Attr {
	if len(fs) == 0 {
		return nil
	}
	attrs := make([]slog.Attr, 0, len(fs))
	for _, f := range fs {
		enc := zapcore.NewMapObjectEncoder()
		f.AddTo(enc)
		for k, v := range enc.Fields {
			attrs = append(attrs, slog.Any(k, v))
		}
	}
	return attrs
}
