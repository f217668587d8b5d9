// Package config loads the mesh's YAML file (--config) with koanf into the
// data structs the packages define, refusing unknown keys and durations
// without a unit, with errors that name the key.
package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/reliability"
)

// File is the whole configuration file.
type File struct {
	reliability.Config `koanf:",squash"`
	// Roles maps method patterns to the roles that may call them
	// (agentick's per-method roles); enforced when the hub has an auth key.
	Roles map[string][]string `koanf:"roles"`
}

// delim separates key levels inside koanf. Method patterns contain dots
// ("memory.*"), so the usual "." would split them; the unit separator
// cannot appear in a key anyone types.
const delim = "\x1f"

// Load reads path over the defaults: keys left out keep their default,
// a policy pattern in the file replaces the seed's policy of that pattern.
// An empty path returns the defaults.
func Load(path string) (File, error) {
	f := File{Config: reliability.DefaultConfig()}
	if path == "" {
		return f, nil
	}
	k := koanf.New(delim)
	if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
		return f, fmt.Errorf("config %s: %w", path, err)
	}
	// Seed policies stay unless the file names the same pattern; the
	// file's policies are decoded into fresh values.
	seed := f.Policies
	f.Policies = nil
	dc := &mapstructure.DecoderConfig{
		TagName:     "koanf",
		ErrorUnused: true,
		Result:      &f,
		DecodeHook:  mapstructure.ComposeDecodeHookFunc(durationHook),
	}
	if err := k.UnmarshalWithConf("", &f, koanf.UnmarshalConf{Tag: "koanf", DecoderConfig: dc}); err != nil {
		return f, fmt.Errorf("config %s: %s", path, cleanErr(err))
	}
	for p, pol := range seed {
		if _, ok := f.Policies[p]; !ok {
			if f.Policies == nil {
				f.Policies = map[string]reliability.Policy{}
			}
			f.Policies[p] = pol
		}
	}
	if err := f.Validate(); err != nil {
		return f, fmt.Errorf("config %s: %w", path, err)
	}
	if err := auth.CheckRoleTable(f.Roles); err != nil {
		return f, fmt.Errorf("config %s: %w", path, err)
	}
	return f, nil
}

var durationType = reflect.TypeFor[time.Duration]()

// durationHook parses "2.5s"-style durations and refuses bare numbers,
// which mapstructure would read as nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	switch v := data.(type) {
	case string:
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration (use a unit, as in 500ms or 2.5s)", v)
		}
		return d, nil
	case int, int64, float64, uint64:
		if reflect.ValueOf(v).IsZero() {
			return time.Duration(0), nil
		}
		return nil, fmt.Errorf("%v has no unit (write 500ms or 2.5s)", v)
	}
	return data, nil
}

// cleanErr turns mapstructure's report into one line per bad key.
func cleanErr(err error) string {
	msg := err.Error()
	msg = strings.ReplaceAll(msg, delim, ".")
	var lines []string
	for _, l := range strings.Split(msg, "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "*"))
		if l == "" || strings.HasSuffix(l, "error(s) decoding:") || strings.HasPrefix(l, "decoding failed due to") {
			continue
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		return errors.Unwrap(err).Error()
	}
	return strings.Join(lines, "; ")
}
