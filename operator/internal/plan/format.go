package plan

import (
	"fmt"
	"strconv"
)

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// Ratio formats a/b with two decimals ("7.42"); empty when b is zero.
func Ratio(a, b int64) string {
	if b <= 0 {
		return ""
	}
	return strconv.FormatFloat(float64(a)/float64(b), 'f', 2, 64)
}

// Throughput formats bytes per second in binary units ("412.3 MiB/s").
func Throughput(bytesPerSec float64) string {
	return binary(bytesPerSec, "B/s", "KiB/s", "MiB/s", "GiB/s", "TiB/s")
}

// HumanBytes formats a size in binary units ("93.2 GiB").
func HumanBytes(n int64) string {
	return binary(float64(n), "B", "KiB", "MiB", "GiB", "TiB", "PiB")
}

// binary formats v with one decimal in the largest of units (each 1024 times the one before)
// that keeps it at least 1.
func binary(v float64, units ...string) string {
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// Percent formats done/total as a whole percentage ("37%"), capped at 100.
func Percent(done, total int64) string {
	if total <= 0 {
		if done > 0 {
			return "100%"
		}
		return "0%"
	}
	p := done * 100 / total
	if p > 100 {
		p = 100
	}
	return itoa(p) + "%"
}

// CacheMiB rounds a memory budget in bytes up to whole MiB (at least 1).
func CacheMiB(bytes int64) int64 {
	const mib = 1 << 20
	if bytes <= 0 {
		return 1
	}
	return (bytes + mib - 1) / mib
}
