package etcd

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// clientLogger is the etcd client's logger: its warnings and errors go to
// the registry's slog logger (the hub's log), tagged logger=etcd-client,
// so that an operator, and S06, see what clientv3 reports about leases and
// connections, e.g. "lease keepalive response queue is full; dropping
// response send". Debug and info lines stay out. During an outage the
// client warns on every failed attempt (about one a second per kind), so
// each message is logged at most 5 times per 10 s.
func clientLogger(log *slog.Logger) *zap.Logger {
	core := zapcore.NewSamplerWithOptions(&slogCore{log: log}, 10*time.Second, 5, 0)
	return zap.New(core).Named("etcd-client")
}

// slogCore is a zapcore.Core writing through a slog.Logger.
type slogCore struct {
	log    *slog.Logger
	fields []zapcore.Field // from With
}

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l >= zapcore.ErrorLevel:
		return slog.LevelError
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	default:
		return slog.LevelDebug
	}
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return l >= zapcore.WarnLevel && c.log.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(fs []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, fields: append(slices.Clip(c.fields), fs...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fs {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := make([]slog.Attr, 0, len(keys)+1)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	c.log.LogAttrs(context.Background(), slogLevel(e.Level), e.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }
