package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckNVMeFlush(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	attach := `{"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:01:00.0"}}`
	for _, c := range []struct {
		name, path string
		want       Status
		found, fix string
	}{
		{"none given", "", Skip, "no SPDK config", ""},
		{"unreadable", filepath.Join(dir, "missing.json"), Warn, "cannot read", ""},
		{"no nvme", write("malloc.json", `{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_malloc_create", "params": {"name": "M"}}]}]}`), Skip, "no NVMe", ""},
		{"flush on", write("on.json", `{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_set_options", "params": {"enable_flush": true}}, `+attach+`]}]}`), OK, "sets enable_flush for Nvme0", ""},
		{"flush off", write("off.json", `{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_set_options", "params": {"enable_flush": false}}, `+attach+`]}]}`), Fail, "refuses", "enable_flush\": true"},
		{"comments", write("comments.json", "{\"subsystems\": [{\"subsystem\": \"bdev\", \"config\": [ // the drive\n"+attach+"]}]}"), Fail, "does not parse", "remove the comments"},
		{"flush unset", write("unset.json", `{"subsystems": [{"subsystem": "bdev", "config": [`+attach+`]}]}`), Warn, "without enable_flush", "bdev_nvme_set_options"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &probe{o: Options{SPDKConfig: c.path}}
			got := p.checkNVMeFlush()
			if got.Status != c.want || !strings.Contains(got.Found, c.found) || !strings.Contains(strings.Join(got.Fix, "\n"), c.fix) {
				t.Fatalf("%+v; want %s, found %q, fix with %q", got, c.want, c.found, c.fix)
			}
		})
	}
}
