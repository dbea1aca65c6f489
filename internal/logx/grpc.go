package logx

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"google.golang.org/grpc/grpclog"
)

// GRPC returns a grpclog.LoggerV2 writing to l (nil: slog.Default() at
// every write) with component=grpc. gRPC's info lines are logged at
// debug: it writes one per connection state change.
func GRPC(l *slog.Logger) grpclog.LoggerV2 { return grpcLogger{l} }

type grpcLogger struct{ l *slog.Logger }

var _ grpclog.DepthLoggerV2 = grpcLogger{}

func (g grpcLogger) log(level slog.Level, msg string) {
	l := g.l
	if l == nil {
		l = slog.Default()
	}
	ctx := context.Background()
	if !l.Enabled(ctx, level) {
		return
	}
	l.Log(ctx, level, strings.TrimSuffix(msg, "\n"), "component", "grpc")
}

func (g grpcLogger) Info(args ...any)   { g.log(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any) { g.log(slog.LevelDebug, fmt.Sprintln(args...)) }
func (g grpcLogger) Infof(format string, args ...any) {
	g.log(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Warning(args ...any)   { g.log(slog.LevelWarn, fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any) { g.log(slog.LevelWarn, fmt.Sprintln(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.log(slog.LevelWarn, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Error(args ...any)   { g.log(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any) { g.log(slog.LevelError, fmt.Sprintln(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) {
	g.log(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal logs at error and exits, as grpclog's contract says.
func (g grpcLogger) Fatal(args ...any) { g.log(slog.LevelError, fmt.Sprint(args...)); os.Exit(1) }
func (g grpcLogger) Fatalln(args ...any) {
	g.log(slog.LevelError, fmt.Sprintln(args...))
	os.Exit(1)
}
func (g grpcLogger) Fatalf(format string, args ...any) {
	g.log(slog.LevelError, fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V reports whether verbosity level v is logged: only 0, gRPC's default.
func (g grpcLogger) V(v int) bool { return v <= 0 }

func (g grpcLogger) InfoDepth(_ int, args ...any)    { g.Info(args...) }
func (g grpcLogger) WarningDepth(_ int, args ...any) { g.Warning(args...) }
func (g grpcLogger) ErrorDepth(_ int, args ...any)   { g.Error(args...) }
func (g grpcLogger) FatalDepth(_ int, args ...any)   { g.Fatal(args...) }
