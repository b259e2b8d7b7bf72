"""The preference family: MADPO, MARLHF's reward model, iterative rounds."""
