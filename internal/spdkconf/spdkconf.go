// Package spdkconf reads and amends SPDK JSON configs (the file
// io.spdk_config names) without SPDK: what the SPDK backend needs to know
// of a config before it hands it to SPDK, and what `weir doctor` checks.
//
// NVMe flushes: SPDK's NVMe bdev completes a FLUSH without sending it to
// the device unless bdev_nvme_set_options set enable_flush (the default is
// false since SPDK changed it in 2025; before that a flush was always a
// no-op). A drive with a volatile write cache then loses writes an fsync
// acknowledged. WithNVMeFlush turns it on in a config that attaches NVMe
// controllers, and refuses one that turns it off.
package spdkconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Call is one method call of a config, with the params weir looks at.
type Call struct {
	Method string `json:"method"`
	Params struct {
		Name        string `json:"name"`
		Filename    string `json:"filename"`     // bdev_aio_create
		BaseName    string `json:"base_name"`    // bdev_error_create
		Trtype      string `json:"trtype"`       // bdev_nvme_attach_controller
		EnableFlush *bool  `json:"enable_flush"` // bdev_nvme_set_options
	} `json:"params"`
}

// Calls lists the calls of a config, every subsystem's in order (a batch,
// an array of calls in a subsystem's list, in place); none for a config
// that does not parse as JSON (SPDK reports it, or accepts what
// encoding/json does not: comments).
func Calls(config []byte) []Call {
	calls, _ := parse(config)
	return calls
}

func parse(config []byte) ([]Call, error) {
	var cfg struct {
		Subsystems []struct {
			Config []json.RawMessage `json:"config"`
		} `json:"subsystems"`
	}
	if err := json.Unmarshal(config, &cfg); err != nil {
		return nil, err
	}
	var calls []Call
	for _, ss := range cfg.Subsystems {
		for _, raw := range ss.Config {
			var batch []Call
			if err := json.Unmarshal(raw, &batch); err == nil {
				calls = append(calls, batch...)
				continue
			}
			var c Call
			if err := json.Unmarshal(raw, &c); err != nil {
				return nil, err
			}
			calls = append(calls, c)
		}
	}
	return calls, nil
}

// attaching is the methods that attach NVMe controllers (the discovery
// ones attach what they discover).
var attaching = map[string]bool{"bdev_nvme_attach_controller": true, "bdev_nvme_start_discovery": true, "bdev_nvme_start_mdns_discovery": true}

// UsesPCI says whether a config attaches a PCIe NVMe controller
// (bdev_nvme_attach_controller with trtype PCIe), the one thing that needs
// DPDK to scan and drive PCI devices.
func UsesPCI(config []byte) bool {
	for _, c := range Calls(config) {
		if c.Method == "bdev_nvme_attach_controller" && strings.EqualFold(c.Params.Trtype, "pcie") {
			return true
		}
	}
	return false
}

// NVMeFlush is what a config says of NVMe flushes.
type NVMeFlush struct {
	Controllers []string // the NVMe controllers it attaches, by name
	// Set: a bdev_nvme_set_options call gives enable_flush, the last one
	// On; otherwise SPDK's default (off) holds.
	Set, On bool
}

// Flush reads what config says of NVMe flushes.
func Flush(config []byte) NVMeFlush {
	var f NVMeFlush
	for _, c := range Calls(config) {
		if attaching[c.Method] {
			f.Controllers = append(f.Controllers, c.Params.Name)
		}
		if c.Method == "bdev_nvme_set_options" && c.Params.EnableFlush != nil {
			f.Set, f.On = true, *c.Params.EnableFlush
		}
	}
	return f
}

// ErrFlushOff is the error of a config that attaches NVMe controllers and
// turns their flushes off.
var ErrFlushOff = errors.New("the SPDK config sets enable_flush false in bdev_nvme_set_options: an NVMe drive's volatile write cache would lose writes fsync acknowledged; remove it or set it true")

// WithNVMeFlush returns config with NVMe flushes on: unchanged when it
// attaches no NVMe controller or already turns them on; otherwise with a
// bdev_nvme_set_options call of enable_flush true first in its bdev
// subsystem (one is added if it has none). Where does not matter: SPDK
// runs every call allowed at startup (set_options is) before the others
// (attach), in file order, and a set_options keeps what it does not give.
// changed says whether it added the call. A config that turns flushes off
// is refused (ErrFlushOff), and so is one that names NVMe methods but does
// not parse as plain JSON (SPDK accepts comments): its flushes cannot be
// checked.
func WithNVMeFlush(config []byte) (out []byte, changed bool, err error) {
	if _, err := parse(config); err != nil {
		for m := range attaching {
			if bytes.Contains(config, []byte(m)) {
				return nil, false, fmt.Errorf("spdk config: it names %s but does not parse as JSON without comments, so weir cannot make sure NVMe flushes reach the drive: %w", m, err)
			}
		}
		return config, false, nil // SPDK will say what is wrong with it
	}
	f := Flush(config)
	switch {
	case len(f.Controllers) == 0 || f.Set && f.On:
		return config, false, nil
	case f.Set:
		return nil, false, ErrFlushOff
	}
	var cfg map[string]any
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.UseNumber() // numbers pass through as written (no float64 rounding)
	if err := dec.Decode(&cfg); err != nil {
		return nil, false, fmt.Errorf("spdk config: %w", err)
	}
	set := map[string]any{"method": "bdev_nvme_set_options", "params": map[string]any{"enable_flush": true}}
	subs, _ := cfg["subsystems"].([]any)
	added := false
	for _, s := range subs {
		ss, _ := s.(map[string]any)
		if ss == nil || ss["subsystem"] != "bdev" {
			continue
		}
		calls, _ := ss["config"].([]any)
		ss["config"] = append([]any{set}, calls...)
		added = true
		break
	}
	if !added {
		cfg["subsystems"] = append([]any{map[string]any{"subsystem": "bdev", "config": []any{set}}}, subs...)
	}
	out, err = json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, false, fmt.Errorf("spdk config: %w", err)
	}
	return out, true, nil
}

// FlushCall is the call to put first in a config's bdev subsystem so that
// NVMe flushes reach the device.
const FlushCall = `{"method": "bdev_nvme_set_options", "params": {"enable_flush": true}}`
