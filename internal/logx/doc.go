// Package logx is the one logging setup of every Crescent binary and the
// adapters that bring etcd's and gRPC's loggers onto it, so an operator
// sees one format on stderr.
//
// A binary calls Flags on its flag set (--log_level debug|info|warn|error,
// --log_format text|json), Options.Validate after parsing (a one-line
// usage error naming the flag), Options.New(os.Stderr) for its logger and
// SetGlobal with it: slog.SetDefault, so library packages whose Logger
// field is nil (they default to slog.Default()) follow it, and
// grpclog.SetLoggerV2, so gRPC's own lines go through the same handler.
//
// Zap returns a *zap.Logger for etcd's client and embedded server that
// writes slog records; GRPC returns the grpclog.LoggerV2 SetGlobal
// installs. Both add a "component" attribute ("etcd", "grpc") saying where
// a line came from. gRPC's info lines (connection state changes, one per
// channel event) are logged at debug; its warnings and errors keep their
// level.
//
// Output: the text format is slog.TextHandler's (time=... level=... msg=...
// key=value), the json format is slog.JSONHandler's, one object per line
// with the keys "time", "level", "msg" and then the record's attributes.
//
// Library policy: a library package takes a Logger *slog.Logger in its
// config and never uses the log package; nil means slog.Default(), so an
// application's slog setup applies. Packages that log through a logger
// their caller always passes (internal/netx) may discard by default.
package logx
