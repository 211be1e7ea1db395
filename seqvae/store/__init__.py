"""The ground floor: the run directory's file names and the one atomic write, the one checkpoint
loader, and the registry of strategy classes a checkpoint may carry. It imports no other room
but `errors`."""
