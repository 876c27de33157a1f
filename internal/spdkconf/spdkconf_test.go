package spdkconf

import (
	"errors"
	"strings"
	"testing"
)

const nvme = `{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_malloc_create", "params": {"name": "M", "num_blocks": 9007199254740993, "block_size": 4096}},
  {"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:01:00.0"}}]}]}`

func TestWithNVMeFlush(t *testing.T) {
	out, changed, err := WithNVMeFlush([]byte(nvme))
	if err != nil || !changed {
		t.Fatalf("an NVMe config without enable_flush: changed %v, %v", changed, err)
	}
	f := Flush(out)
	if !f.Set || !f.On || len(f.Controllers) != 1 || f.Controllers[0] != "Nvme0" {
		t.Fatalf("amended config: %+v\n%s", f, out)
	}
	calls := Calls(out)
	if len(calls) != 3 || calls[0].Method != "bdev_nvme_set_options" || calls[2].Method != "bdev_nvme_attach_controller" || !UsesPCI(out) {
		t.Fatalf("the set_options call must come first, the attach kept: %+v", calls)
	}
	// Params weir does not know survive.
	if got := string(out); !strings.Contains(got, `"traddr": "0000:01:00.0"`) || !strings.Contains(got, `"num_blocks": 9007199254740993`) {
		t.Fatalf("params changed:\n%s", got)
	}
	// Already on: unchanged. No NVMe: unchanged.
	on := `{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_set_options", "params": {"enable_flush": true}},
  {"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "PCIe"}}]}]}`
	malloc := `{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_malloc_create", "params": {"name": "M", "num_blocks": 1, "block_size": 4096}}]}]}`
	for _, c := range []string{on, malloc} {
		if out, changed, err := WithNVMeFlush([]byte(c)); err != nil || changed || string(out) != c {
			t.Fatalf("config changed (%v, %v):\n%s", changed, err, c)
		}
	}
	// Off: refused. A later set_options without enable_flush keeps it.
	off := `{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_set_options", "params": {"enable_flush": false}},
  {"method": "bdev_nvme_set_options", "params": {"action_on_timeout": "none"}},
  {"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "PCIe"}}]}]}`
	if _, _, err := WithNVMeFlush([]byte(off)); !errors.Is(err, ErrFlushOff) {
		t.Fatalf("a config turning flushes off: %v", err)
	}
}

// What SPDK accepts and a first reading missed: batches, discovery, an
// attach outside a bdev subsystem, and comments.
func TestWithNVMeFlushOtherShapes(t *testing.T) {
	for name, c := range map[string]string{
		"batch":     `{"subsystems": [{"subsystem": "bdev", "config": [[{"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "TCP"}}]]}]}`,
		"discovery": `{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_start_discovery", "params": {"name": "D", "trtype": "TCP"}}]}]}`,
		"no bdev":   `{"subsystems": [{"subsystem": "nvmf", "config": [{"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "TCP"}}]}]}`,
	} {
		out, changed, err := WithNVMeFlush([]byte(c))
		if err != nil || !changed {
			t.Fatalf("%s: changed %v, %v", name, changed, err)
		}
		if f := Flush(out); !f.Set || !f.On || len(f.Controllers) != 1 {
			t.Fatalf("%s: amended config %+v:\n%s", name, f, out)
		}
	}
	commented := "{\"subsystems\": [{\"subsystem\": \"bdev\", \"config\": [ /* the drive */\n{\"method\": \"bdev_nvme_attach_controller\", \"params\": {\"name\": \"Nvme0\"}}]}]}"
	if _, _, err := WithNVMeFlush([]byte(commented)); err == nil || !strings.Contains(err.Error(), "comments") {
		t.Fatalf("an NVMe config with comments: %v, want a refusal", err)
	}
	// Comments in a config without NVMe: left to SPDK.
	plain := "{\"subsystems\": [] /* none */}"
	if out, changed, err := WithNVMeFlush([]byte(plain)); err != nil || changed || string(out) != plain {
		t.Fatalf("a config without NVMe, with comments: %v, %v", changed, err)
	}
}

// TestUsesPCI: DPDK drives PCI devices only for a config that attaches a
// PCIe NVMe controller; aio, malloc and NVMe-oF (TCP) configs keep PCI off.
func TestUsesPCI(t *testing.T) {
	for _, c := range []struct {
		json string
		want bool
	}{
		{`{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:01:00.0"}}]}]}`, true},
		{`{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "pcie", "traddr": "0000:01:00.0"}}]}]}`, true},
		{`{"subsystems": [{"subsystem": "bdev", "config": [[{"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "PCIe"}}]]}]}`, true},
		{`{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "TCP", "traddr": "10.0.0.1", "trsvcid": "4420", "subnqn": "nqn.x"}}]}]}`, false},
		{`{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 32768, "block_size": 4096}}, {"method": "bdev_aio_create", "params": {"name": "Aio0", "filename": "/tmp/x", "block_size": 4096}}]}]}`, false},
		{`not json`, false},
	} {
		if got := UsesPCI([]byte(c.json)); got != c.want {
			t.Errorf("UsesPCI(%.90s) = %v, want %v", c.json, got, c.want)
		}
	}
}
