package mem_test

import (
	"testing"

	"github.com/weir-storage/weir/services/io/backend"
	"github.com/weir-storage/weir/services/io/backend/backendtest"
	"github.com/weir-storage/weir/services/io/backend/mem"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, backendtest.Factory{
		New: func(t *testing.T) backend.Backend { return mem.New() },
	})
}
