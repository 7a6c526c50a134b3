package gormoutbox_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/internal/dbtest"
)

// BenchmarkPlainModel measures what the plugin costs a model that records
// no events: the same Create, built but not sent (DryRun), with and without
// the plugin. allocs/op should be equal.
func BenchmarkPlainModel(b *testing.B) {
	for _, withPlugin := range []bool{false, true} {
		b.Run(fmt.Sprintf("plugin=%t", withPlugin), func(b *testing.B) {
			db, err := gorm.Open(postgres.New(postgres.Config{Conn: dbtest.DB(b)}), &gorm.Config{
				Logger: logger.Discard, DryRun: true, SkipDefaultTransaction: true,
			})
			require.NoError(b, err)
			if withPlugin {
				require.NoError(b, db.Use(&gormoutbox.Plugin{}))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := db.Create(&Plain{Name: "x"}).Error; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCreate measures a real Create in GORM's default transaction of a
// model carrying 0, 1 or 10 events.
func BenchmarkCreate(b *testing.B) {
	for _, n := range []int{0, 1, 10} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			bundle := setup(b, nil, nil)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				order := Order{Status: "new", Total: 1}
				for i := range n {
					order.Record(evt("order.placed", fmt.Sprint(i)))
				}
				if err := bundle.db.Create(&order).Error; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
