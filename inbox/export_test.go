package inbox

import amqp "github.com/rabbitmq/amqp091-go"

// SetAfterCommit makes Handle call f between the commit and the ack.
func SetAfterCommit(ib *Inbox, f func(*amqp.Delivery)) { ib.afterCommit = f }
