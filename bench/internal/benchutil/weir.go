package benchutil

import (
	"fmt"
	"os/exec"
	"path/filepath"
)

// BuildWeir compiles cmd/weir into dir and returns the binary's path. It
// needs the go tool and a working directory inside the weir module.
func BuildWeir(dir string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("no weir binary given (-weir) and no go tool to build one: %w", err)
	}
	exe := filepath.Join(dir, "weir")
	cmd := exec.Command(goTool, "build", "-o", exe, "github.com/weir-storage/weir/cmd/weir")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build cmd/weir: %v\n%s", err, out)
	}
	return exe, nil
}
