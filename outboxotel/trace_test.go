package outboxotel_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/acemq/outbox"
	"github.com/acemq/outbox/gormoutbox"
	"github.com/acemq/outbox/internal/amqptest"
	"github.com/acemq/outbox/internal/dbtest"
	"github.com/acemq/outbox/outboxotel"
	"github.com/acemq/outbox/relay"
)

// Invoice records its events; the test writes it with GORM.
type Invoice struct {
	ID    uint
	Total int
	outbox.Recorder
}

// Issue 10, item 2: a span started around tx.Create is the parent of the
// relay's publish span, and the message the consumer receives carries a
// traceparent of that trace, naming the publish span.
func TestTraceFromWriterToConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))

	conn := amqptest.Conn(t)
	top := amqptest.Declare(t, conn)
	consumer := amqptest.Consume(t, conn, top.Queue)
	sch := dbtest.Schema(t)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: dbtest.DB(t)}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	require.NoError(t, db.Use(&gormoutbox.Plugin{Table: sch + ".outbox", Router: outbox.ToExchange(top.Exchange), Headers: outboxotel.Headers(nil)}))
	store, err := outbox.NewStore(dbtest.DB(t), &outbox.StoreConfig{Table: sch + ".outbox", Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, store.CreateRowsSchemaIfAbsent(ctx))
	require.NoError(t, db.Table(sch+".invoices").AutoMigrate(&Invoice{}))

	// The writer: a request's span around the GORM write.
	wctx, writer := tp.Tracer("app").Start(ctx, "place invoice")
	inv := &Invoice{Total: 42}
	inv.Record(outbox.Event{Type: "invoice.created", Payload: []byte(`{}`)})
	require.NoError(t, db.WithContext(wctx).Table(sch+".invoices").Create(inv).Error)
	writer.End()

	pub, err := relay.NewAMQPPublisher(&relay.AMQPConfig{URL: amqptest.URL(), Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	r, err := relay.New(store, outboxotel.Tracing(pub, &outboxotel.TraceConfig{TracerProvider: tp}), &relay.Config{Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { cancel(); require.NoError(t, <-done); require.NoError(t, pub.Close()) }()
	require.Eventually(t, func() bool { return consumer.Distinct() == 1 }, 30*time.Second, 10*time.Millisecond)

	var publish tracetest.SpanStub
	require.Eventually(t, func() bool {
		for _, s := range exporter.GetSpans() {
			if strings.HasPrefix(s.Name, "publish ") {
				publish = s
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, "publish "+top.Exchange, publish.Name)
	require.Equal(t, trace.SpanKindProducer, publish.SpanKind)
	require.Equal(t, writer.SpanContext().TraceID(), publish.SpanContext.TraceID(), "the publish span is in the writer's trace")
	require.Equal(t, writer.SpanContext().SpanID(), publish.Parent.SpanID(), "and the writer's span is its parent")

	d := consumer.Last()
	traceparent, _ := d.Headers["traceparent"].(string)
	require.Equal(t, "00-"+publish.SpanContext.TraceID().String()+"-"+publish.SpanContext.SpanID().String()+"-01", traceparent,
		"the consumer continues from the publish span")
}
