"""What one engine iteration costs: the batch summary a scheduler hands over, the cost models
(unit, roofline, measured kernel tables + engine overheads, fitted profiles) and their registry."""
