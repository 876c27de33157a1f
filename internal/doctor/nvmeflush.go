package doctor

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/weir-storage/weir/internal/spdkconf"
)

// checkNVMeFlush reads the SPDK JSON config (Options.SPDKConfig): one that
// attaches NVMe controllers must set enable_flush in bdev_nvme_set_options,
// or SPDK completes flushes without sending them to the drive, and a drive
// with a volatile write cache loses what fsync acknowledged. weir's IO
// service adds the call when it loads a config without it (and refuses a
// config that turns it off); other SPDK programs given the same file would
// not, so the file should say it.
func (p *probe) checkNVMeFlush() Check {
	c := Check{Name: "SPDK NVMe flushes"}
	path := p.o.SPDKConfig
	if path == "" {
		c.Status, c.Found = Skip, "no SPDK config given (--spdk-config, or io.spdk_config in --config)"
		return c
	}
	b, err := os.ReadFile(path)
	if err != nil {
		c.Status, c.Found = Warn, fmt.Sprintf("cannot read %s: %v", path, err)
		return c
	}
	if _, _, err := spdkconf.WithNVMeFlush(b); err != nil && !errors.Is(err, spdkconf.ErrFlushOff) {
		c.Status, c.Found = Fail, fmt.Sprintf("%s: %v", path, err)
		c.Fix = []string{"# remove the comments from " + path + " (the IO service refuses it as it is)"}
		return c
	}
	f := spdkconf.Flush(b)
	switch {
	case len(f.Controllers) == 0:
		c.Status, c.Found = Skip, fmt.Sprintf("%s attaches no NVMe controller", path)
	case f.Set && f.On:
		c.Status, c.Found = OK, fmt.Sprintf("%s sets enable_flush for %s", path, strings.Join(f.Controllers, ", "))
	case f.Set:
		c.Status = Fail
		c.Found = fmt.Sprintf("%s sets enable_flush false for %s: SPDK completes flushes without the drive, and the IO service refuses this config", path, strings.Join(f.Controllers, ", "))
		c.Fix = []string{"# in " + path + ": set \"enable_flush\": true in bdev_nvme_set_options"}
	default:
		c.Status = Warn
		c.Found = fmt.Sprintf("%s attaches %s without enable_flush: the IO service turns it on when it loads the config; other SPDK programs with this file would not flush the drive", path, strings.Join(f.Controllers, ", "))
		c.Fix = []string{"# in " + path + ": put this first in the bdev subsystem's \"config\" list:", "#   " + spdkconf.FlushCall}
	}
	return c
}
