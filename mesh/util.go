package mesh

import "time"

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
