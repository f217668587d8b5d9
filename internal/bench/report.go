package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Report is the outcome of a run. Its JSON uses ghz and vegeta field names
// where they fit; latencies are in milliseconds.
type Report struct {
	Method       string           `json:"method"`
	Mode         string           `json:"mode"` // "closed loop" or "open loop"
	TargetRPS    float64          `json:"targetRps,omitempty"`
	Concurrency  int              `json:"concurrency"`
	Connections  int              `json:"connections"`
	Count        int64            `json:"count"`
	Succeeded    int64            `json:"success"`
	Errors       map[string]int64 `json:"errorDistribution"`
	Missed       int64            `json:"missed"` // open loop: sends that found every slot busy
	TotalSeconds float64          `json:"total"`
	RPS          float64          `json:"rps"`
	Latencies    Latencies        `json:"latencies"`
	Histogram    []Bucket         `json:"histogram"`
	Slowest      []Slow           `json:"slowest"`
	Stream       *StreamReport    `json:"stream,omitempty"` // --stream: what the streams carried
	hist         *hdrhistogram.Histogram
}

// Latencies in milliseconds.
type Latencies struct {
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"50th"`
	P90  float64 `json:"90th"`
	P95  float64 `json:"95th"`
	P99  float64 `json:"99th"`
	P999 float64 `json:"99.9th"`
	Max  float64 `json:"max"`
}

// Bucket is one bar of the latency histogram (ghz's histogram).
type Bucket struct {
	Mark      float64 `json:"mark"`
	Count     int64   `json:"count"`
	Frequency float64 `json:"frequency"`
}

// Slow is one of the slowest calls: its trace (whose root is the bench's
// client span, spanId, exported after the run), latency and code.
type Slow struct {
	TraceID   string    `json:"traceId"`
	SpanID    string    `json:"spanId"`
	RequestID string    `json:"requestId"`
	Start     time.Time `json:"start"` // when the call was due (open loop) or sent
	LatencyMs float64   `json:"latencyMs"`
	Code      string    `json:"code"`
}

// ErrorRate is failed ÷ count.
func (r *Report) ErrorRate() float64 {
	if r.Count == 0 {
		return 0
	}
	return float64(r.Count-r.Succeeded) / float64(r.Count)
}

func fmtMs(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 1:
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.1f µs", v*1000)
}

// Print writes the human report. jaeger, when set, turns trace ids into links.
func (r *Report) Print(w io.Writer, jaeger string) {
	fmt.Fprintf(w, "\nSummary (%s, %s, c=%d, %d connection(s)):\n", r.Method, r.Mode, r.Concurrency, r.Connections)
	fmt.Fprintf(w, "  Count:\t%d\n  Total:\t%.2f s\n  Slowest:\t%s\n  Fastest:\t%s\n  Average:\t%s\n  Requests/sec:\t%.1f\n",
		r.Count, r.TotalSeconds, fmtMs(r.Latencies.Max), fmtMs(r.Latencies.Min), fmtMs(r.Latencies.Mean), r.RPS)
	if r.Mode == "open loop" {
		fmt.Fprintf(w, "  Target rate:\t%.1f/s (latency from the intended send time; %d sends late)\n", r.TargetRPS, r.Missed)
	}
	if len(r.Histogram) > 0 {
		fmt.Fprintf(w, "\nResponse time histogram:\n")
		var most int64
		for _, b := range r.Histogram {
			most = max(most, b.Count)
		}
		for _, b := range r.Histogram {
			bar := 0
			if most > 0 {
				bar = int(40 * b.Count / most)
			}
			fmt.Fprintf(w, "  %10s [%d]\t|%s\n", fmtMs(b.Mark), b.Count, strings.Repeat("∎", bar))
		}
	}
	fmt.Fprintf(w, "\nLatency distribution:\n")
	for _, p := range []struct {
		name string
		v    float64
	}{{"50 %", r.Latencies.P50}, {"90 %", r.Latencies.P90}, {"95 %", r.Latencies.P95}, {"99 %", r.Latencies.P99}, {"99.9 %", r.Latencies.P999}} {
		fmt.Fprintf(w, "  %s in %s\n", p.name, fmtMs(p.v))
	}
	if r.Stream != nil {
		r.Stream.print(w)
	}
	fmt.Fprintf(w, "\nStatus code distribution:\n  [OK]\t%d responses\n", r.Succeeded)
	codes := make([]string, 0, len(r.Errors))
	for c := range r.Errors {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	for _, c := range codes {
		fmt.Fprintf(w, "  [%s]\t%d responses\n", c, r.Errors[c])
	}
	if len(r.Slowest) > 0 {
		fmt.Fprintf(w, "\nSlowest calls (trace ids):\n")
		for _, s := range r.Slowest {
			id := s.TraceID
			if jaeger != "" {
				id = strings.TrimSuffix(jaeger, "/") + "/trace/" + id
			}
			fmt.Fprintf(w, "  %10s  %-8s %s\n", fmtMs(s.LatencyMs), s.Code, id)
		}
	}
}

// WriteHDR writes the percentile distribution in HdrHistogram's format
// (values in milliseconds), which the standard plotters read.
func (r *Report) WriteHDR(w io.Writer) error {
	if r.hist == nil {
		return fmt.Errorf("bench: no histogram")
	}
	_, err := r.hist.PercentilesPrint(w, 5, 1e6)
	return err
}

// Compare prints the deltas from old to r.
func (r *Report) Compare(w io.Writer, old *Report) {
	row := func(name string, before, after float64, unit string, lowerIsBetter bool) {
		delta := "n/a"
		if before != 0 {
			d := 100 * (after - before) / before
			verdict := ""
			if math.Abs(d) >= 5 {
				if (d < 0) == lowerIsBetter {
					verdict = " better"
				} else {
					verdict = " worse"
				}
			}
			delta = fmt.Sprintf("%+.1f %%%s", d, verdict)
		}
		fmt.Fprintf(w, "  %-8s %12.3f %-3s -> %12.3f %-3s  %s\n", name, before, unit, after, unit, delta)
	}
	fmt.Fprintf(w, "\nCompared with the earlier run:\n")
	row("rps", old.RPS, r.RPS, "/s", false)
	row("p50", old.Latencies.P50, r.Latencies.P50, "ms", true)
	row("p90", old.Latencies.P90, r.Latencies.P90, "ms", true)
	row("p99", old.Latencies.P99, r.Latencies.P99, "ms", true)
	row("p99.9", old.Latencies.P999, r.Latencies.P999, "ms", true)
	row("max", old.Latencies.Max, r.Latencies.Max, "ms", true)
	row("errors", 100*old.ErrorRate(), 100*r.ErrorRate(), "%", true)
}

// ReadReport reads a JSON report written with -o json.
func ReadReport(rd io.Reader) (*Report, error) {
	var r Report
	if err := json.NewDecoder(rd).Decode(&r); err != nil {
		return nil, fmt.Errorf("bench: not a report: %w", err)
	}
	return &r, nil
}

// Bound is one --fail-on condition, such as p99>20ms or errors>0.1%.
type Bound struct {
	Metric string // p50 p90 p95 p99 p99.9 max mean errors rps
	Op     string // > >= < <=
	Value  float64
	text   string
}

// ParseBounds parses "p99>20ms,errors>0.1%,rps<1000".
func ParseBounds(s string) ([]Bound, error) {
	var out []Bound
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		i := strings.IndexAny(part, "<>")
		if i <= 0 {
			return nil, fmt.Errorf("bench: --fail-on %q: want METRIC>VALUE or METRIC<VALUE", part)
		}
		b := Bound{Metric: strings.ToLower(part[:i]), Op: part[i : i+1], text: part}
		rest := part[i+1:]
		if strings.HasPrefix(rest, "=") {
			b.Op += "="
			rest = rest[1:]
		}
		var err error
		switch b.Metric {
		case "p50", "p90", "p95", "p99", "p99.9", "max", "mean":
			var d time.Duration
			d, err = time.ParseDuration(rest)
			b.Value = float64(d.Nanoseconds()) / 1e6
		case "errors":
			if strings.HasSuffix(rest, "%") {
				b.Value, err = strconv.ParseFloat(strings.TrimSuffix(rest, "%"), 64)
			} else {
				var f float64
				f, err = strconv.ParseFloat(rest, 64)
				b.Value = 100 * f
			}
		case "rps":
			b.Value, err = strconv.ParseFloat(rest, 64)
		default:
			return nil, fmt.Errorf("bench: --fail-on %q: unknown metric %q (p50 p90 p95 p99 p99.9 max mean errors rps)", part, b.Metric)
		}
		if err != nil {
			return nil, fmt.Errorf("bench: --fail-on %q: bad value %q", part, rest)
		}
		out = append(out, b)
	}
	return out, nil
}

// Broken returns the bounds r breaks, as text.
func (r *Report) Broken(bounds []Bound) []string {
	var out []string
	for _, b := range bounds {
		var v float64
		switch b.Metric {
		case "p50":
			v = r.Latencies.P50
		case "p90":
			v = r.Latencies.P90
		case "p95":
			v = r.Latencies.P95
		case "p99":
			v = r.Latencies.P99
		case "p99.9":
			v = r.Latencies.P999
		case "max":
			v = r.Latencies.Max
		case "mean":
			v = r.Latencies.Mean
		case "errors":
			v = 100 * r.ErrorRate()
		case "rps":
			v = r.RPS
		}
		broken := false
		switch b.Op {
		case ">":
			broken = v > b.Value
		case ">=":
			broken = v >= b.Value
		case "<":
			broken = v < b.Value
		case "<=":
			broken = v <= b.Value
		}
		if broken {
			out = append(out, fmt.Sprintf("%s (measured %.3f)", b.text, v))
		}
	}
	return out
}
