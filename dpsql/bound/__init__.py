"""bound"""
