package openai

// parseSteps parses raw and returns the parser's step count with the result.
func parseSteps(raw []byte) (Prompt, error, int) {
	var p promptParser
	pr, err := p.parse(raw)
	return pr, err, p.steps
}
