"""The handles users hold: state, scope, transaction, queue, lock...."""
