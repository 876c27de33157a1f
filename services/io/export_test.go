package iosvc

import "github.com/weir-storage/weir/ring"

// SetNewRegion replaces how s creates a session's region (ring.Create), so
// that tests can make huge pages fail. Call it before Start.
func SetNewRegion(s *Service, f func(ring.Config) (*ring.Region, error)) { s.newRegion = f }
