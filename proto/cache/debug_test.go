package cache

import "runtime/debug"

func debugSetPanicOnFault() { debug.SetPanicOnFault(true) }
